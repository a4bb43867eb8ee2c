import keras
from keras import ops

from elita_tf.layers.causal_mixer import CausalMixer
from elita_tf.checks import check_integer, check_sequence_length
from elita_tf.layers.options import DEFAULT_SEQUENCE_LENGTH
from elita_tf.layers.checks import input_width
from elita_tf.layers.initializers import clone_initializer
from elita_tf.ops.softmax_attention import (
    KV_CACHE_NAMES,
    causal_visibility,
    empty_kv_cache,
    softmax_attention,
    update_kv_cache,
)


@keras.saving.register_keras_serializable(package="elita_tf")
class ShapedAttention(CausalMixer):
    """Shaped attention of the Simplified Transformer (He & Hofmann 2023), causal.

    Per head, with identity values `v = x` (no value or output projection):

        A = α I + β softmax(causal(Q Kᵀ / sqrt(D))) − γ C,      y = A v

    `C` is the uniform causal average (row `i` averages positions `<= i`).
    `α, β, γ` are trainable per head, initialised to 1, and the query kernel
    is zero-initialised, so the softmax is uniform and `A = I` at
    initialisation: every block starts as the identity.

        softmax part         C (centring)
        row 0: x . . .       1 . . .
        row 1: x x . .       ½ ½ . .
        row 2: x x x .       ⅓ ⅓ ⅓ .

    With `value_projection=True` (the first layer in the paper) the values
    are `x (r_v W_V + s_v I)` with `W_V` zero-initialised, `r_v = s_v = 1`.
    Decoding keeps a fixed-size key/value cache (softmax attention has no
    constant-size state).

    Args:
        num_heads: int. Number of heads `H`; the input width must be divisible by it.
        value_projection: bool. Learn a value projection with gains. Defaults to `False`.
        max_sequence_length: int, at least 2. Positions a decoding cache holds. Defaults to
            `DEFAULT_SEQUENCE_LENGTH` (256), the backbone's.
        query_initializer: initializer of the query kernel. Defaults to `"zeros"`.
        key_initializer: initializer of the key kernel. Defaults to
            `RandomNormal(stddev=0.02)`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[B, T, d]` (already normalised).
        padding_mask: optional bool `[B, T]`, False at padding: padded positions
            are neither attended nor averaged. Defaults to the Keras mask.
        cache: optional dict `{"key", "value", "valid", "position"}` from `get_initial_cache`
            or a previous call.
        document_starts: optional bool `[B, T]`, True where a document starts (packed
            documents, without a cache): the softmax and the average `C`
            both stay inside each document.
        training: ignored.

    Returns:
        `outputs [B, T, d]`, or `(outputs, new_cache)` when a cache is passed.

    Example:
    >>> layer = ShapedAttention(num_heads=4)
    >>> x = keras.random.normal([2, 10, 32])
    >>> bool(keras.ops.all(keras.ops.abs(layer(x) - x) < 1e-5))  # A = I at init
    True

    References:
        - [He & Hofmann, 2023](https://arxiv.org/abs/2311.01906)
        - [Noci et al., 2023](https://arxiv.org/abs/2306.17759) (centred attention)
    """

    def __init__(
        self,
        num_heads,
        value_projection=False,
        max_sequence_length=DEFAULT_SEQUENCE_LENGTH,
        query_initializer="zeros",
        key_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_integer("num_heads", num_heads)
        check_sequence_length("max_sequence_length", max_sequence_length)
        self.num_heads = num_heads
        self.value_projection = bool(value_projection)
        self.max_sequence_length = max_sequence_length
        self.query_initializer = keras.initializers.get(query_initializer)
        self.key_initializer = keras.initializers.get(key_initializer or keras.initializers.RandomNormal(stddev=0.02))

    def build(self, inputs_shape):
        width = input_width(inputs_shape)
        if width % self.num_heads:
            raise ValueError(
                f"The input width must be divisible by num_heads. Received: width={width}, num_heads={self.num_heads}"
            )
        h, e = self.num_heads, width // self.num_heads

        def weight(name, shape, initializer):
            return self.add_weight(
                name=name, shape=shape, initializer=clone_initializer(initializer), dtype=self.variable_dtype
            )

        # EinsumDense and Dense layers, so that Keras' int8 quantization and LoRA cover the projections.
        def heads_projection(name, initializer):
            layer = keras.layers.EinsumDense(
                "btd,dhe->bthe",
                output_shape=(None, h, e),
                bias_axes="he",
                kernel_initializer=clone_initializer(initializer),
                name=name,
                dtype=self.dtype_policy,
            )
            layer.build((None, None, width))
            return layer

        self.query_dense = heads_projection("query", self.query_initializer)
        self.key_dense = heads_projection("key", self.key_initializer)
        self.alpha = weight("alpha", (h,), "ones")
        self.beta = weight("beta", (h,), "ones")
        self.gamma = weight("gamma", (h,), "ones")
        if self.value_projection:
            self.value_dense = keras.layers.Dense(
                width, use_bias=False, kernel_initializer="zeros", name="value", dtype=self.dtype_policy
            )
            self.value_dense.build((None, None, width))
            self.value_gain = weight("value_gain", (), "ones")
            self.value_skip_gain = weight("value_skip_gain", (), "ones")
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: width})

    # The documented weights are the projections' kernels and biases.
    @property
    def query_kernel(self):
        return self.query_dense.kernel

    @property
    def query_bias(self):
        return self.query_dense.bias

    @property
    def key_kernel(self):
        return self.key_dense.kernel

    @property
    def key_bias(self):
        return self.key_dense.bias

    @property
    def value_kernel(self):
        return self.value_dense.kernel

    def mix(self, inputs, padding_mask, cache, training, document_starts=None):
        width, heads = inputs.shape[-1], self.num_heads
        values = inputs
        if self.value_projection:
            values = self.value_gain * self.value_dense(inputs) + self.value_skip_gain * inputs
        split = lambda t: ops.reshape(t, (*ops.shape(t)[:2], heads, width // heads))  # noqa: E731
        q = self.query_dense(inputs)
        k = self.key_dense(inputs)
        v = split(values)  # [B, T, H, e]

        if cache is None:
            visible = causal_visibility(ops.shape(inputs)[1], padding_mask, document_starts)
            keys, all_values = k, v
        else:
            cache, visible = update_kv_cache(cache, k, v, padding_mask, name=self.name)
            keys, all_values = cache["key"], cache["value"]
        attended = softmax_attention(q, keys, all_values, visible)
        # C v: the uniform average of the visible values, never materialised as C.
        acc = attended.dtype
        seen = ops.cast(visible[:, 0], acc)  # [B or 1, T, S]
        seen = seen / ops.maximum(ops.sum(seen, axis=-1, keepdims=True), 1.0)
        seen = ops.broadcast_to(seen, (*ops.shape(all_values)[:1], *ops.shape(seen)[1:]))
        centre = ops.einsum("bts,bshe->bthe", seen, ops.cast(all_values, acc))

        gain = lambda w: ops.cast(w, acc)[:, None]  # noqa: E731  [H, 1]
        y = gain(self.alpha) * ops.cast(v, acc) + gain(self.beta) * attended - gain(self.gamma) * centre
        outputs = ops.reshape(ops.cast(y, self.compute_dtype), ops.shape(inputs))
        return outputs if cache is None else (outputs, cache)

    cache_names = KV_CACHE_NAMES

    def initial_state(self, batch_size, dtype=None):
        """`(key [B, L, H, e], value [B, L, H, e], valid [B, L] bool, position [B])`, `L = max_sequence_length`."""
        if not self.built:
            raise ValueError(f"Layer '{self.name}' needs its input width: build or call it before `get_initial_cache`.")
        width, heads, head_dim = self.key_kernel.shape
        return empty_kv_cache(batch_size, self.max_sequence_length, heads, head_dim, dtype or self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "value_projection": self.value_projection,
                "max_sequence_length": self.max_sequence_length,
                "query_initializer": keras.initializers.serialize(self.query_initializer),
                "key_initializer": keras.initializers.serialize(self.key_initializer),
            }
        )
        return config
