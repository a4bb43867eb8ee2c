import keras
from keras import ops

from elita_tf.checks import check_integer
from elita_tf.layers.causal_mixer import CausalMixer
from elita_tf.layers.checks import get_activation, input_width
from elita_tf.ops.short_convolution import empty_short_convolution_state, short_convolution, short_convolution_step


@keras.saving.register_keras_serializable(package="elita_tf")
class ShortConvolution(CausalMixer):
    """A short causal depthwise convolution, the token shift of the linear models that recall.

    Each channel is a weighted sum of its own last `K` inputs, then an
    activation (SiLU by default), as flash-linear-attention's
    `ShortConvolution` and the convolution Based puts before its linear
    attention:

        y_t = σ(b + Σ_{j<K} w_j ⊙ x_{t - (K - 1) + j})

        row 0: x . . . .
        row 1: x x . . .      the last K = 3 positions, a weight per lag and channel
        row 2: x x x . .
        row 3: . x x x .

    It lets a position see its neighbours before the mixer does, so that a
    linear mixer's keys can hold "the token after this one" (the induction a
    recall task needs). Decoding keeps the last `K - 1` inputs
    (`{"convolution_inputs": [B, K - 1, d]}`), a constant-size state; a padded position
    is a zero input, and a document start clears what came before.
    `ElitaBackbone(short_convolution=K)` puts one before the mixer of every block.

    Args:
        kernel_size: int `K >= 1`. Positions each output sees. Defaults to `4`.
        activation: activation after the sum, or None. Defaults to `"silu"`.
        use_bias: bool. Defaults to `False`.
        kernel_initializer: initializer of the `[K, d]` kernel. Defaults to
            PyTorch's for a depthwise convolution, uniform in `±1 / sqrt(K)`.
        bias_initializer: initializer of the bias. Defaults to `"zeros"`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[B, T, d]`.
        padding_mask: optional bool `[B, T]`, False at padding: a padded input adds
            nothing. Defaults to the Keras mask.
        cache: optional dict `{"convolution_inputs"}` from `get_initial_cache` or a previous call.
        document_starts: optional bool `[B, T]`: nothing before a document's start is seen from it on.
        training: ignored.

    Returns:
        `outputs [B, T, d]`, or `(outputs, new_cache)` when a cache is passed.

    Example:
    >>> layer = ShortConvolution(kernel_size=4)
    >>> tuple(layer(np.zeros([2, 10, 32], "float32")).shape)
    (2, 10, 32)

    References:
        - [Arora et al., 2024, Based](https://arxiv.org/abs/2402.18668)
        - [flash-linear-attention's ShortConvolution](https://github.com/fla-org/flash-linear-attention)
    """

    def __init__(
        self,
        kernel_size=4,
        activation="silu",
        use_bias=False,
        kernel_initializer=None,
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_integer("kernel_size", kernel_size)
        self.kernel_size = kernel_size
        self.activation = get_activation("activation", activation)
        self.use_bias = bool(use_bias)
        if kernel_initializer is None:  # PyTorch's Conv1d: kaiming_uniform(a=sqrt(5)), fan-in K a channel
            kernel_initializer = keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform")
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, inputs_shape):
        width = input_width(inputs_shape)
        self.kernel = self.add_weight(
            name="kernel", shape=(self.kernel_size, width), initializer=self.kernel_initializer
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(name="bias", shape=(width,), initializer=self.bias_initializer)
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: width})

    document_starts_with_cache = True
    cache_names = ("convolution_inputs",)

    def mix(self, inputs, padding_mask, cache, training, document_starts=None):
        state = None if cache is None else cache["convolution_inputs"]
        if cache is not None and inputs.shape[1] == 1:
            step_mask = None if padding_mask is None else padding_mask[:, 0]
            y, state = short_convolution_step(state, inputs[:, 0], self.kernel, self.bias, mask=step_mask)
            y = y[:, None]
        else:
            y, state = short_convolution(
                inputs, self.kernel, self.bias, mask=padding_mask, initial_state=state, document_starts=document_starts
            )
        outputs = ops.cast(self.activation(y), self.compute_dtype)
        return outputs if cache is None else (outputs, {"convolution_inputs": state})

    def initial_state(self, batch_size, dtype=None):
        """`(convolution_inputs [B, K - 1, d],)`, zeros (float32, or float64 for a float64 layer)."""
        if not self.built:
            raise ValueError(f"Layer '{self.name}' needs its input width: build or call it before `get_initial_cache`.")
        width = self.kernel.shape[1]
        return (empty_short_convolution_state(batch_size, self.kernel_size, width, dtype or self.compute_dtype),)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "kernel_size": self.kernel_size,
                "activation": keras.activations.serialize(self.activation),
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
