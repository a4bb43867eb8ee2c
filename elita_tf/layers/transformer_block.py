import keras
import tensorflow as tf

from elita_tf.layers.checks import check_positive_int, input_width
from elita_tf.layers.mixer import CausalMixer
from elita_tf.ops.softmax_attention import empty_kv_cache, softmax_attention, update_kv_cache


@keras.saving.register_keras_serializable(package="elita_tf")
class TransformerBlock(CausalMixer):
    """The baseline: a pre-norm causal Transformer decoder block.

        h = x + Dropout(MultiHeadAttention(LN(x), causal))
        y = h + Dropout(W2 gelu(W1 LN(h)))          # hidden width 4d by default

        row 0: x . . .
        row 1: x x . .      softmax attention over every earlier position
        row 2: x x x .

    Attention is `keras.layers.MultiHeadAttention` with a causal mask.
    Decoding keeps a key/value cache of fixed size `[B, max_length, H, D]`
    and the index of the next position; each step is O(max_length).

    Args:
        num_heads: int. Number of heads `H`.
        head_dim: int or None. Query/key/value width per head. Defaults to
            `d // num_heads`.
        intermediate_dim: int or None. Hidden width of the feed-forward
            network. Defaults to `4 * d`.
        dropout: float. Dropout on both residual branches and the attention
            weights. Defaults to `0.0`.
        layer_norm_epsilon: float. Defaults to `1e-5`.
        max_length: int. Positions a decoding cache holds. Defaults to `1024`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[B, T, d]`.
        padding_mask: optional bool `[B, T]`, False at padding: padded keys
            get no attention. Defaults to the Keras mask.
        cache: optional `(key [B, L, H, D], value [B, L, H, D], valid [B, L],
            index [])` from `get_initial_cache` or a previous call.
        training: bool, for dropout.

    Returns:
        `outputs [B, T, d]`, or `(outputs, new_cache)` when a cache is passed.

    Example:
    >>> block = TransformerBlock(num_heads=4)
    >>> block(tf.zeros([2, 10, 32])).shape
    TensorShape([2, 10, 32])

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
    """

    def __init__(
        self,
        num_heads,
        head_dim=None,
        intermediate_dim=None,
        dropout=0.0,
        layer_norm_epsilon=1e-5,
        max_length=1024,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("head_dim", head_dim, allow_none=True)
        check_positive_int("intermediate_dim", intermediate_dim, allow_none=True)
        check_positive_int("max_length", max_length)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout!r}")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.intermediate_dim = intermediate_dim
        self.dropout = float(dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.max_length = max_length

    def build(self, inputs_shape):
        width = input_width(inputs_shape)
        head_dim = self.head_dim or max(1, width // self.num_heads)
        sub = {"dtype": self.dtype_policy}
        self.attention_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, name="attention_norm", **sub
        )
        self.attention = keras.layers.MultiHeadAttention(
            self.num_heads, head_dim, dropout=self.dropout, name="attention", **sub
        )
        self.ffn_norm = keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon, name="ffn_norm", **sub)
        self.ffn_inner = keras.layers.Dense(
            self.intermediate_dim or 4 * width, activation="gelu", name="ffn_inner", **sub
        )
        self.ffn_output = keras.layers.Dense(width, name="ffn_output", **sub)
        self.residual_dropout = keras.layers.Dropout(self.dropout, **sub)
        for layer in (self.attention_norm, self.ffn_norm, self.ffn_inner):
            layer.build(inputs_shape)
        self.attention.build(inputs_shape, inputs_shape)
        self.ffn_output.build(tuple(inputs_shape[:-1]) + (self.intermediate_dim or 4 * width,))
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: width})

    def _cached_attention(self, x, padding_mask, cache):
        """Attention of the new positions over the cache, which they are written into."""
        attention = self.attention
        cache, visible = update_kv_cache(
            cache, attention.key_dense(x), attention.value_dense(x), padding_mask, name=self.name
        )
        context = softmax_attention(attention.query_dense(x), cache[0], cache[1], visible)
        return attention.output_dense(tf.cast(context, self.compute_dtype)), cache

    def mix(self, inputs, padding_mask, cache, training):
        x = self.attention_norm(inputs)
        if cache is None:
            attention_mask = None if padding_mask is None else padding_mask[:, None, :]
            attended = self.attention(x, x, attention_mask=attention_mask, use_causal_mask=True, training=training)
        else:
            attended, cache = self._cached_attention(x, padding_mask, cache)
        h = inputs + self.residual_dropout(attended, training=training)
        y = self.ffn_output(self.ffn_inner(self.ffn_norm(h)))
        outputs = h + self.residual_dropout(y, training=training)
        return outputs if cache is None else (outputs, cache)

    def get_initial_cache(self, batch_size, dtype=None):
        """`(key [B, L, H, D], value [B, L, H, D], valid [B, L] bool, index [])`, `L = max_length`."""
        if not self.built:
            raise ValueError(f"Layer '{self.name}' needs its input width: build or call it before `get_initial_cache`.")
        heads, head_dim = self.attention.key_dense.kernel.shape[-2:]
        return empty_kv_cache(batch_size, self.max_length, heads, head_dim, dtype or self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "max_length": self.max_length,
            }
        )
        return config
