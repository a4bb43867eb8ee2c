"""Causal linear attention (Katharopoulos et al. 2020; docs/math.md §5).

With feature maps `φ(q_i), φ(k_j) > 0`:

    S_i = Σ_{j<=i} φ(k_j) v_jᵀ      z_i = Σ_{j<=i} φ(k_j)
    out_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i + ε)

    row 0: x . . .
    row 1: x x . .      every earlier position, weight φ(q_i)·φ(k_j)
    row 2: x x x .

The normaliser is the numerator of an all-ones value column, so one pass
computes both. Forms:
- `causal_linear_attention`: chunks of `C` positions; inside a chunk
  `(φQ φKᵀ ⊙ causal) V`, between chunks the state `S` before the chunk (an
  exclusive cumulative sum of per-chunk `φKᵀV`). O(T * C * D + T * D^2 / C)
  time, O(T * D^2 / C) memory: no `[T, D, D]` or `[T, T]` tensor.
- `causal_linear_attention_step`: one decoding step from `(S, z)`.
All sums are float32 (float64 stays float64) whatever the input dtype:
`S` and `z` grow linearly with T.
"""

import tensorflow as tf

from elita_tf.ops.utils.documents import document_index, gated_scan
from elita_tf.ops.utils.dtypes import accumulator_dtype

LINEAR_ATTENTION_CHUNK_SIZE = 64


def empty_linear_state(batch_size, num_heads, key_dim, value_dim, dtype=tf.float32):
    """`(S [B, H, Dk, Dv], z [B, H, Dk])` before any position."""
    dtype = accumulator_dtype(dtype)
    return (
        tf.zeros([batch_size, num_heads, key_dim, value_dim], dtype),
        tf.zeros([batch_size, num_heads, key_dim], dtype),
    )


def _with_ones(values):
    """`[..., Dv] -> [..., Dv + 1]`: the last column carries the normaliser."""
    return tf.concat([values, tf.ones_like(values[..., :1])], axis=-1)


def _normalise(numerator, epsilon):
    return numerator[..., :-1] / (numerator[..., -1:] + epsilon)


def causal_linear_attention(
    query_features,
    key_features,
    values,
    mask=None,
    initial_state=None,
    epsilon=1e-6,
    chunk_size=LINEAR_ATTENTION_CHUNK_SIZE,
    document_starts=None,
):
    """Causal linear attention over feature-mapped queries and keys, parallel over time.

    Args:
        query_features: `[B, H, T, Dk]`, `φ(q)`, positive.
        key_features: `[B, H, T, Dk]`, `φ(k)`, positive.
        values: `[B, H, T, Dv]`.
        mask: optional bool `[B, T]`, False at padding: a padded key adds
            nothing to `S` or `z`.
        initial_state: optional `(S, z)` of earlier positions.
        epsilon: float added to the denominator.
        chunk_size: int `C`.
        document_starts: optional bool `[B, T]`, True where a new document starts:
            from there on nothing before it (the initial state included) is
            seen, and the returned state holds the last document alone.

    Returns:
        `(outputs [B, H, T, Dv], state)` with `state = (S, z)` after the
        last position. Outputs are in the accumulator dtype.
    """
    dtype = accumulator_dtype(values.dtype)
    q = tf.cast(query_features, dtype)
    k = tf.cast(key_features, dtype)
    v = _with_ones(tf.cast(values, dtype))  # [B, H, T, Dv + 1]
    if mask is not None:
        # Selects, not products: a padded position adds nothing whatever it holds (0 * NaN is NaN).
        keep = tf.cast(mask, tf.bool)[:, None, :, None]
        k = tf.where(keep, k, tf.zeros([], dtype))
        v = tf.where(keep, v, tf.zeros([], dtype))
    b, h, length = tf.shape(q)[0], tf.shape(q)[1], tf.shape(q)[2]
    dk, dv = tf.shape(q)[3], tf.shape(v)[3]
    if initial_state is None:
        initial = tf.zeros([b, h, dk, dv], dtype)
    else:
        initial = tf.concat([tf.cast(initial_state[0], dtype), tf.cast(initial_state[1], dtype)[..., None]], -1)

    pad = (-length) % chunk_size
    paddings = [[0, 0], [0, 0], [0, pad], [0, 0]]
    q, k, v = (tf.reshape(tf.pad(t, paddings), [b, h, -1, chunk_size, tf.shape(t)[3]]) for t in (q, k, v))

    causal = tf.range(chunk_size)[None, :] <= tf.range(chunk_size)[:, None]  # [C, C]
    if document_starts is None:
        chunk_kv = tf.einsum("bhnck,bhncv->bhnkv", k, v)  # [B, H, N, Dk, Dv + 1]
        state_before = tf.cumsum(chunk_kv, axis=2, exclusive=True) + initial[:, :, None]
        scores = tf.where(causal, tf.matmul(q, k, transpose_b=True), tf.zeros([], dtype))
        numerator = tf.matmul(scores, v) + tf.matmul(q, state_before)  # [B, H, N, C, Dv + 1]
        final = initial + tf.reduce_sum(chunk_kv, axis=2)
    else:
        numerator, final = _with_document_starts(q, k, v, initial, document_starts, causal, chunk_size)
    outputs = _normalise(tf.reshape(numerator, [b, h, -1, dv])[:, :, :length], epsilon)
    return outputs, (final[..., :-1], final[..., -1])


def _with_document_starts(q, k, v, initial, document_starts, causal, chunk_size):
    """The chunked form with documents starting at `document_starts`: the numerator `[B, H, N, C, Dv + 1]`, the state.

    Inside a chunk a key is seen from its own document only; a chunk's state
    holds its last document's keys, and the state carried between chunks
    restarts at every chunk with a reset (`gated_scan`, exact: no differences of sums).
    """
    seg = tf.reshape(document_index(document_starts, chunk_size), [tf.shape(q)[0], 1, -1, chunk_size])  # [B, 1, N, C]
    same = tf.equal(seg[..., :, None], seg[..., None, :])
    scores = tf.where(causal & same, tf.matmul(q, k, transpose_b=True), tf.zeros([], q.dtype))
    last = seg[..., -1]  # each chunk's last document [B, 1, N]; before the first, the initial state's (0)
    before_last = tf.pad(last, [[0, 0], [0, 0], [1, 0]])[..., :-1]
    tail = tf.equal(seg, last[..., None])[..., None]
    chunk_kv = tf.einsum("bhnck,bhncv->bhnkv", tf.where(tail, k, tf.zeros([], k.dtype)), v)
    # Entry 0 is the initial state; chunk n continues the state unless a document starts in it.
    gates = tf.concat([tf.zeros_like(last[..., :1], tf.bool), tf.equal(last, before_last)], axis=2)
    gates = tf.broadcast_to(gates, tf.concat([tf.shape(q)[:2], tf.shape(gates)[2:]], 0))  # every head
    (after,) = gated_scan(
        gates, (tf.concat([initial[:, :, None], chunk_kv], axis=2),), lambda a, b: (a[0] + b[0],), axis=2
    )
    # Rows of the document that was open before the chunk read the state before it.
    carried = tf.equal(seg, before_last[..., None])[..., None]
    numerator = tf.matmul(scores, v) + tf.where(carried, tf.matmul(q, after[:, :, :-1]), tf.zeros([], q.dtype))
    return numerator, after[:, :, -1]


def causal_linear_attention_step(state, query_features, key_features, value, mask=None, epsilon=1e-6):
    """One decoding step: `[B, H, Dk]` features, `[B, H, Dv]` value.

    Returns:
        `(output [B, H, Dv], new_state)`; a masked step leaves the state unchanged.
    """
    dtype = accumulator_dtype(value.dtype)
    q, k, value = (tf.cast(t, dtype) for t in (query_features, key_features, value))
    if mask is not None:
        keep = tf.cast(mask, tf.bool)[:, None, None]
        k = tf.where(keep, k, tf.zeros([], dtype))
        value = tf.where(keep, value, tf.zeros([], dtype))
    s, z = state
    s = s + k[..., :, None] * value[..., None, :]
    z = z + k
    numerator = tf.einsum("bhk,bhkv->bhv", q, s)
    denominator = tf.einsum("bhk,bhk->bh", q, z)[..., None]
    return numerator / (denominator + epsilon), (s, z)
