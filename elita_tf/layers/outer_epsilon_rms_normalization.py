import keras
from keras import ops

from elita_tf.layers.checks import input_width
from elita_tf.ops.utils.dtypes import accumulator_dtype


@keras.saving.register_keras_serializable(package="elita_tf")
class OuterEpsilonRMSNormalization(keras.layers.Layer):
    """RMS normalisation with epsilon added to the root mean square: the Simplified Transformer's code.

        y = g · x / (sqrt(mean(x²)) + ε)

    over the last axis, with a learned gain `g` (ones at start). Keras'
    `RMSNormalization` computes `g · x / sqrt(mean(x²) + ε)` instead; the two
    differ only for rows whose mean square is near ε. The statistics are
    float32 under mixed precision.

    Args:
        epsilon: float. Added to the root mean square. Defaults to `1e-5`
            (GPT-2's `layer_norm_epsilon`, which the original passes on).
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Example:
    >>> keras.ops.shape(OuterEpsilonRMSNormalization()(keras.ops.ones((2, 5, 8))))
    (2, 5, 8)

    References:
        - [He and Hofmann, 2023](https://arxiv.org/abs/2311.01906), `RMSNorm` in the authors'
          `simplified_transformers/model_utils.py`.
    """

    def __init__(self, epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)
        self.supports_masking = True

    def build(self, inputs_shape):
        self.scale = self.add_weight(
            name="scale", shape=(input_width(inputs_shape),), initializer="ones", dtype=self.variable_dtype
        )

    def call(self, inputs):
        dtype = accumulator_dtype(self.compute_dtype)
        x = ops.cast(inputs, dtype)
        # A sum over the width, not `ops.mean`: Keras' mean reduces float64 in float32 on JAX and PyTorch.
        rms = ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True) / x.shape[-1])
        return ops.cast(ops.cast(self.scale, dtype) * x / (rms + self.epsilon), self.compute_dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config["epsilon"] = self.epsilon
        return config
