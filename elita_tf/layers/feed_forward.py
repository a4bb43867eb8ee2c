import keras

from elita_tf.checks import check_integer
from elita_tf.layers.checks import check_sequence_call, get_activation, input_width
from elita_tf.layers.initializers import clone_initializer
from elita_tf.layers.renamed_arguments import UpgradesRenamedArguments


@keras.saving.register_keras_serializable(package="elita_tf")
class FeedForward(UpgradesRenamedArguments, keras.layers.Layer):
    """The position-wise two-layer MLP of a Transformer block, and the One Wide FFN (Pires et al. 2023).

        y = W2 act(W1 x + b1) + b2

    Alone it is the usual `4d` MLP. The One Wide FFN is one instance shared
    by every block: give the same instance to every `DecoderBlock` (or call
    it in every block of a functional model), and Keras holds its weights
    once, also after `.keras` save/load. With `shared_by=n` its default width
    `4 * d * n` keeps the parameter count of `n` separate `4d` networks.

    Args:
        intermediate_dim: int or None. Hidden width. Defaults to `4 * d * shared_by`.
        shared_by: int. The blocks that share it, for the default width. Defaults to `1`.
        activation: activation of the hidden layer. Defaults to `"relu"`.
        use_bias: bool. Whether both layers have biases. Defaults to `True`.
        kernel_initializer: Defaults to `"glorot_uniform"`.
        bias_initializer: Defaults to `"zeros"`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[B, T, d]`.
        padding_mask: ignored (position-wise).
        training: ignored.

    Returns:
        `outputs [B, T, d]`.

    Example:
    >>> shared = FeedForward(shared_by=6)
    >>> x = keras.Input((None, 32))
    >>> for _ in range(6):
    ...     x = x + shared(x)  # one set of weights, 4 * 32 * 6 hidden units

    References:
        - [Pires et al., 2023](https://arxiv.org/abs/2309.01826)
    """

    def __init__(
        self,
        intermediate_dim=None,
        shared_by=1,
        activation="relu",
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_integer("intermediate_dim", intermediate_dim, optional=True)
        check_integer("shared_by", shared_by)
        self.intermediate_dim = intermediate_dim
        self.shared_by = shared_by
        self.activation = get_activation("activation", activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        width = input_width(inputs_shape)
        hidden = self.intermediate_dim or 4 * width * self.shared_by
        dense = lambda units, name, activation=None: keras.layers.Dense(  # noqa: E731
            units,
            activation=activation,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
        self.inner = dense(hidden, "inner", self.activation)
        self.inner.build(inputs_shape)
        self.outer = dense(width, "outer")
        self.outer.build(tuple(inputs_shape[:-1]) + (hidden,))
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: width})

    def call(self, inputs, padding_mask=None, training=None):
        inputs, _ = check_sequence_call(self, inputs, padding_mask)
        return self.outer(self.inner(inputs))

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "shared_by": self.shared_by,
                "activation": keras.activations.serialize(self.activation),
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


# elita-tf 0.1.0 saved this layer as `WideFeedForward(width, num_layers)`: its `.keras` files name it so.
keras.saving.get_custom_objects()["elita_tf>WideFeedForward"] = FeedForward
