import keras

from elita_tf.ops.layer_norm import unscaled_layer_norm


@keras.saving.register_keras_serializable(package="elita_tf")
class UnscaledLayerNormalization(keras.layers.Layer):
    """Layer normalisation over the last axis with no scale or centre: ELiTA's block norm.

    The same outputs as `keras.layers.LayerNormalization(center=False,
    scale=False)`, float32 statistics under mixed precision, and a custom
    gradient that reads the output instead of a float32 copy of the input
    (`unscaled_layer_norm`, docs/math.md §8): under `mixed_bfloat16` a
    `[B, T, d]` float32 array less held per norm for the backward pass.

    Args:
        epsilon: float. Added to the variance. Defaults to `1e-3`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Example:
    >>> keras.ops.shape(UnscaledLayerNormalization()(keras.ops.zeros((2, 5, 8))))
    (2, 5, 8)
    """

    def __init__(self, epsilon=1e-3, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)
        self.supports_masking = True

    def call(self, inputs):
        return unscaled_layer_norm(inputs, self.epsilon)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config["epsilon"] = self.epsilon
        return config
