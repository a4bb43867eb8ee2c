import keras


@keras.saving.register_keras_serializable(package="elita_tf")
class Gain(keras.layers.Layer):
    """A trainable scalar gain: `y = g x`.

    The Simplified Transformer's branch gains (`β_FF = 0.1` at
    initialisation) around a shared One Wide FFN.

    Args:
        initial_value: float. The gain at initialisation. Defaults to `1.0`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Example:
    >>> Gain(0.1)(tf.ones([2, 3])).numpy()[0, 0]
    0.1
    """

    def __init__(self, initial_value=1.0, **kwargs):
        super().__init__(**kwargs)
        self.initial_value = float(initial_value)
        self.supports_masking = True

    def build(self, inputs_shape):
        self.gain = self.add_weight(
            name="gain",
            shape=(),
            initializer=keras.initializers.Constant(self.initial_value),
            dtype=self.variable_dtype,
        )

    def call(self, inputs):
        return self.gain * inputs

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        return {**super().get_config(), "initial_value": self.initial_value}
