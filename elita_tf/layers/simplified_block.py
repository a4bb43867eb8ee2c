import keras

from elita_tf.layers.checks import check_choice, check_positive_int, input_width
from elita_tf.layers.initializers import clone_initializer
from elita_tf.layers.mixer import CausalMixer
from elita_tf.layers.shaped_attention import ShapedAttention

VARIANTS = ("parallel", "sequential")


@keras.saving.register_keras_serializable(package="elita_tf")
class SimplifiedBlock(CausalMixer):
    """Skip-less Simplified Transformer block (He & Hofmann 2023): SAS-P or SAS.

    `"parallel"` (SAS-P): one shared pre-norm, no skip connection (the
    identity path is the `α I` of shaped attention):

        xn = RMSNorm(x)
        y  = β_FF · MLP(xn) + β_SA · ShapedAttention(xn)

    `"sequential"` (SAS): `h = β_SA · ShapedAttention(RMSNorm1(x))`,
    `y = h + β_FF · MLP(RMSNorm2(h))`.

    `MLP(x) = W2 relu(W1 x)` without biases, hidden width `4d`; `β_SA = 1`,
    `β_FF = 0.1` at initialisation, both trainable. With `feedforward=False`
    the block has no MLP and returns its attention branch only, for models
    that add one shared `WideFeedForward` themselves.

    Args:
        num_heads: int. Heads of the shaped attention.
        variant: `"parallel"` or `"sequential"`. Defaults to `"parallel"`.
        intermediate_dim: int or None. MLP width. Defaults to `4 * d`.
        feedforward: bool. Whether the block has its own MLP. Defaults to `True`.
        value_projection: bool. Learned values with gains (the first layer in
            the paper). Defaults to `False`.
        attention_gain: float. Initial `β_SA`. Defaults to `1.0`.
        feedforward_gain: float. Initial `β_FF`. Defaults to `0.1`.
        layer_norm_epsilon: float. Defaults to `1e-5`.
        max_length: int. Positions a decoding cache holds. Defaults to `1024`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[B, T, d]`.
        padding_mask: optional bool `[B, T]`. Defaults to the Keras mask.
        cache: optional cache of the shaped attention (`get_initial_cache`).
        training: ignored.

    Returns:
        `outputs [B, T, d]`, or `(outputs, new_cache)` when a cache is passed.

    Example:
    >>> block = SimplifiedBlock(num_heads=4)
    >>> block(tf.zeros([2, 10, 32])).shape
    TensorShape([2, 10, 32])

    References:
        - [He & Hofmann, 2023](https://arxiv.org/abs/2311.01906)
    """

    def __init__(
        self,
        num_heads,
        variant="parallel",
        intermediate_dim=None,
        feedforward=True,
        value_projection=False,
        attention_gain=1.0,
        feedforward_gain=0.1,
        layer_norm_epsilon=1e-5,
        max_length=1024,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_choice("variant", variant, VARIANTS)
        check_positive_int("intermediate_dim", intermediate_dim, allow_none=True)
        check_positive_int("max_length", max_length)
        self.num_heads = num_heads
        self.variant = variant
        self.intermediate_dim = intermediate_dim
        self.feedforward = bool(feedforward)
        self.value_projection = bool(value_projection)
        self.attention_gain = float(attention_gain)
        self.feedforward_gain = float(feedforward_gain)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.max_length = max_length

    def build(self, inputs_shape):
        width = input_width(inputs_shape)
        sub = {"dtype": self.dtype_policy}
        norm = lambda name: keras.layers.RMSNormalization(epsilon=self.layer_norm_epsilon, name=name, **sub)  # noqa: E731
        self.attention_norm = norm("attention_norm")
        self.attention_norm.build(inputs_shape)
        self.attention = ShapedAttention(
            self.num_heads, value_projection=self.value_projection, max_length=self.max_length, name="attention", **sub
        )
        self.attention.build(inputs_shape)
        self.attention_scale = self.add_weight(
            name="attention_gain",
            shape=(),
            initializer=keras.initializers.Constant(self.attention_gain),
            dtype=self.variable_dtype,
        )
        if self.feedforward:
            if self.variant == "sequential":
                self.ffn_norm = norm("ffn_norm")
                self.ffn_norm.build(inputs_shape)
            hidden = self.intermediate_dim or 4 * width
            init = keras.initializers.RandomNormal(stddev=0.02)
            self.ffn_inner = keras.layers.Dense(
                hidden,
                activation="relu",
                use_bias=False,
                kernel_initializer=clone_initializer(init),
                name="ffn_inner",
                **sub,
            )
            self.ffn_inner.build(inputs_shape)
            self.ffn_output = keras.layers.Dense(
                width, use_bias=False, kernel_initializer=clone_initializer(init), name="ffn_output", **sub
            )
            self.ffn_output.build(tuple(inputs_shape[:-1]) + (hidden,))
            self.ffn_scale = self.add_weight(
                name="feedforward_gain",
                shape=(),
                initializer=keras.initializers.Constant(self.feedforward_gain),
                dtype=self.variable_dtype,
            )
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: width})

    def mix(self, inputs, padding_mask, cache, training):
        xn = self.attention_norm(inputs)
        if cache is None:
            attended = self.attention(xn, padding_mask=padding_mask)
        else:
            attended, cache = self.attention(xn, padding_mask=padding_mask, cache=cache)
        h = self.attention_scale * attended
        if not self.feedforward:
            outputs = h
        elif self.variant == "parallel":
            outputs = h + self.ffn_scale * self.ffn_output(self.ffn_inner(xn))
        else:
            outputs = h + self.ffn_scale * self.ffn_output(self.ffn_inner(self.ffn_norm(h)))
        return outputs if cache is None else (outputs, cache)

    def get_initial_cache(self, batch_size, dtype=None):
        """The shaped attention's key/value cache."""
        if not self.built:
            raise ValueError(f"Layer '{self.name}' needs its input width: build or call it before `get_initial_cache`.")
        return self.attention.get_initial_cache(batch_size, dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "variant": self.variant,
                "intermediate_dim": self.intermediate_dim,
                "feedforward": self.feedforward,
                "value_projection": self.value_projection,
                "attention_gain": self.attention_gain,
                "feedforward_gain": self.feedforward_gain,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "max_length": self.max_length,
            }
        )
        return config
