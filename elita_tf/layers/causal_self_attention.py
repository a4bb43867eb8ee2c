import keras
from keras import ops

from elita_tf.layers.causal_mixer import CausalMixer
from elita_tf.checks import check_dropout, check_integer, check_sequence_length
from elita_tf.layers.options import DEFAULT_SEQUENCE_LENGTH
from elita_tf.layers.checks import input_width
from elita_tf.ops.softmax_attention import (
    KV_CACHE_NAMES,
    causal_visibility,
    empty_kv_cache,
    softmax_attention,
    update_kv_cache,
)


@keras.saving.register_keras_serializable(package="elita_tf")
class CausalSelfAttention(CausalMixer):
    """Causal softmax multi-head self-attention: the standard Transformer's token mixer.

        y = W_O concat_h softmax(causal(Q_h K_hᵀ / sqrt(D))) V_h

        row 0: x . . .
        row 1: x x . .      every earlier position (and itself)
        row 2: x x x .

    With `sliding_window_size=W`, each position sees itself and the `W - 1`
    before it (sliding-window attention, the local attention of Based's and
    Mistral's hybrids; `W = 2` below):

        row 0: x . . .
        row 1: x x . .
        row 2: . x x .

    The parallel form is `keras.layers.MultiHeadAttention` with a causal
    mask (built by comparing positions), so the baseline is Keras' own attention. Decoding keeps a
    key/value cache of fixed size `[B, max_sequence_length, H, D]` and each row's
    next position; a step costs O(max_sequence_length).

    Args:
        num_heads: int. Number of heads `H`.
        head_dim: int or None. Query/key/value width per head. Defaults to
            `d // num_heads`.
        dropout: float in `[0, 1)`. Dropout on the attention weights (training only).
            Defaults to `0.0`.
        max_sequence_length: int, at least 2. Positions a decoding cache holds. Defaults to
            `DEFAULT_SEQUENCE_LENGTH` (256), the backbone's.
        sliding_window_size: int or None. The positions each one attends,
            itself included; None (the default) attends every earlier one. The
            training form masks a `[T, T]` score matrix and the decoding cache
            still holds `max_sequence_length` positions: the window changes
            what is seen, not yet what is stored. A window counts positions
            as the windowed additive attention's: a padded decoding step keeps
            its place, a prefill's right padding ends its row's prompt.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[B, T, d]`.
        padding_mask: optional bool `[B, T]`, False at padding: padded keys
            get no attention. Defaults to the Keras mask.
        cache: optional dict `{"key", "value", "valid", "position"}` from
            `get_initial_cache` or a previous call.
        document_starts: optional bool `[B, T]`, True where a document starts (packed
            documents, without a cache): the mask is block-diagonal.
        training: bool, for dropout.

    Returns:
        `outputs [B, T, d]`, or `(outputs, new_cache)` when a cache is passed.

    Example:
    >>> layer = CausalSelfAttention(num_heads=4)
    >>> keras.ops.shape(layer(keras.ops.zeros((2, 10, 32))))
    (2, 10, 32)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
    """

    cache_names = KV_CACHE_NAMES

    def __init__(
        self,
        num_heads,
        head_dim=None,
        dropout=0.0,
        max_sequence_length=DEFAULT_SEQUENCE_LENGTH,
        sliding_window_size=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_integer("num_heads", num_heads)
        check_integer("head_dim", head_dim, optional=True)
        check_sequence_length("max_sequence_length", max_sequence_length)
        check_dropout("dropout", dropout)
        check_integer("sliding_window_size", sliding_window_size, optional=True)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dropout = float(dropout)
        self.max_sequence_length = max_sequence_length
        self.sliding_window_size = sliding_window_size

    def build(self, inputs_shape):
        width = input_width(inputs_shape)
        self.attention = keras.layers.MultiHeadAttention(
            self.num_heads,
            self.head_dim or max(1, width // self.num_heads),
            dropout=self.dropout,
            name="attention",
            dtype=self.dtype_policy,
        )
        self.attention.build(inputs_shape, inputs_shape)
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: width})

    def mix(self, inputs, padding_mask, cache, training, document_starts=None):
        attention = self.attention
        if cache is None:
            # Causality, padding and documents in one mask. Not `use_causal_mask=True`: Keras builds that mask
            # from cumulative sums of ones, which XLA constant-folds position by position (minutes at T = 2048).
            length = ops.shape(inputs)[1]
            visible = causal_visibility(length, padding_mask, document_starts)
            positions = ops.arange(length, dtype="int32")
            attention_mask = self._in_window(visible, positions[None, :], positions)[:, 0]
            return attention(inputs, inputs, attention_mask=attention_mask, training=training)
        # Decoding: the new positions are written into the cache (slot n holds position n), then attend over it.
        queries = cache["position"][:, None] + ops.arange(ops.shape(inputs)[1], dtype="int32")[None, :]  # [B, T]
        window = self.sliding_window_size is not None  # a window counts padded steps, as the windowed means do
        key, value = attention.key_dense(inputs), attention.value_dense(inputs)
        cache, visible = update_kv_cache(cache, key, value, padding_mask, name=self.name, padded_steps_count=window)
        visible = self._in_window(visible, queries, ops.arange(self.max_sequence_length, dtype="int32"))
        context = softmax_attention(attention.query_dense(inputs), cache["key"], cache["value"], visible)
        return attention.output_dense(ops.cast(context, self.compute_dtype)), cache

    def _in_window(self, visible, queries, keys):
        """`visible [B, 1, T, S]` and, with a window, `query - key < sliding_window_size` (`queries [B or 1, T]`
        and `keys [S]`: positions)."""
        if self.sliding_window_size is None:
            return visible
        near = (queries[:, :, None] - keys[None, None, :]) < self.sliding_window_size
        return ops.logical_and(visible, near[:, None])

    def initial_state(self, batch_size, dtype=None):
        """`(key [B, L, H, D], value [B, L, H, D], valid [B, L] bool, position [B])`, `L = max_sequence_length`."""
        if not self.built:
            raise ValueError(f"Layer '{self.name}' needs its input width: build or call it before `get_initial_cache`.")
        heads, head_dim = self.attention.key_dense.kernel.shape[-2:]
        return empty_kv_cache(batch_size, self.max_sequence_length, heads, head_dim, dtype or self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "dropout": self.dropout,
                "max_sequence_length": self.max_sequence_length,
                "sliding_window_size": self.sliding_window_size,
            }
        )
        return config
