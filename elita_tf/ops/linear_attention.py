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

from keras import ops

from elita_tf import backend
from elita_tf.ops.utils.documents import document_index, gated_scan
from elita_tf.ops.utils.dtypes import accumulator_dtype
from elita_tf.ops.utils.positions import pad_axis, shift_right
from elita_tf.renames import accepts_renamed_arguments

LINEAR_ATTENTION_CHUNK_SIZE = 64


def empty_linear_state(batch_size, num_heads, key_dim, value_dim, dtype="float32"):
    """`(S [B, H, Dk, Dv], z [B, H, Dk])` before any position."""
    dtype = accumulator_dtype(dtype)
    return (
        ops.zeros((batch_size, num_heads, key_dim, value_dim), dtype),
        ops.zeros((batch_size, num_heads, key_dim), dtype),
    )


def _with_ones(values):
    """`[..., Dv] -> [..., Dv + 1]`: the last column carries the normaliser."""
    return ops.concatenate([values, ops.ones_like(values[..., :1])], axis=-1)


def _normalise(numerator, epsilon):
    return numerator[..., :-1] / (numerator[..., -1:] + epsilon)


@accepts_renamed_arguments
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
    q = ops.cast(query_features, dtype)
    k = ops.cast(key_features, dtype)
    v = _with_ones(ops.cast(values, dtype))  # [B, H, T, Dv + 1]
    if mask is not None:
        # Selects, not products: a padded position adds nothing whatever it holds (0 * NaN is NaN).
        keep = ops.cast(mask, "bool")[:, None, :, None]
        k = ops.where(keep, k, 0.0)
        v = ops.where(keep, v, 0.0)
    b, h, length = ops.shape(q)[0], ops.shape(q)[1], ops.shape(q)[2]
    dk, dv = ops.shape(q)[3], ops.shape(v)[3]
    if initial_state is None:
        initial = ops.zeros((b, h, dk, dv), dtype)
    else:
        initial = ops.concatenate(
            [ops.cast(initial_state[0], dtype), ops.cast(initial_state[1], dtype)[..., None]], -1
        )

    pad = (-length) % chunk_size
    q, k, v = (ops.reshape(pad_axis(t, 2, pad), (b, h, -1, chunk_size, ops.shape(t)[3])) for t in (q, k, v))

    causal = ops.arange(chunk_size, dtype="int32")[None, :] <= ops.arange(chunk_size, dtype="int32")[:, None]  # [C, C]
    if document_starts is None:
        chunk_kv = ops.einsum("bhnck,bhncv->bhnkv", k, v)  # [B, H, N, Dk, Dv + 1]
        state_before = backend.cumsum(chunk_kv, axis=2, exclusive=True) + initial[:, :, None]
        scores = ops.where(causal, backend.matmul(q, k, transpose_b=True), 0.0)
        numerator = backend.matmul(scores, v) + backend.matmul(q, state_before)  # [B, H, N, C, Dv + 1]
        final = initial + ops.sum(chunk_kv, axis=2)
    else:
        numerator, final = _with_document_starts(q, k, v, initial, document_starts, causal, chunk_size)
    outputs = _normalise(ops.reshape(numerator, (b, h, -1, dv))[:, :, :length], epsilon)
    return outputs, (final[..., :-1], final[..., -1])


def _with_document_starts(q, k, v, initial, document_starts, causal, chunk_size):
    """The chunked form with documents starting at `document_starts`: the numerator `[B, H, N, C, Dv + 1]`, the state.

    Inside a chunk a key is seen from its own document only; a chunk's state
    holds its last document's keys, and the state carried between chunks
    restarts at every chunk with a reset (`gated_scan`, exact: no differences of sums).
    """
    seg = ops.reshape(document_index(document_starts, chunk_size), (ops.shape(q)[0], 1, -1, chunk_size))  # [B, 1, N, C]
    same = ops.equal(seg[..., :, None], seg[..., None, :])
    scores = ops.where(ops.logical_and(causal, same), backend.matmul(q, k, transpose_b=True), 0.0)
    last = seg[..., -1]  # each chunk's last document [B, 1, N]; before the first, the initial state's (0)
    before_last = shift_right(last, 2, 0)
    tail = ops.equal(seg, last[..., None])[..., None]
    chunk_kv = ops.einsum("bhnck,bhncv->bhnkv", ops.where(tail, k, 0.0), v)
    # Entry 0 is the initial state; chunk n continues the state unless a document starts in it.
    gates = ops.concatenate([ops.zeros_like(last[..., :1], "bool"), ops.equal(last, before_last)], axis=2)
    gates = ops.broadcast_to(gates, (*ops.shape(q)[:2], *ops.shape(gates)[2:]))  # every head
    (after,) = gated_scan(
        gates, (ops.concatenate([initial[:, :, None], chunk_kv], axis=2),), lambda a, b: (a[0] + b[0],), axis=2
    )
    # Rows of the document that was open before the chunk read the state before it.
    carried = ops.equal(seg, before_last[..., None])[..., None]
    numerator = backend.matmul(scores, v) + ops.where(carried, backend.matmul(q, after[:, :, :-1]), 0.0)
    return numerator, after[:, :, -1]


def causal_linear_attention_step(state, query_features, key_features, value, mask=None, epsilon=1e-6):
    """One decoding step: `[B, H, Dk]` features, `[B, H, Dv]` value.

    Returns:
        `(output [B, H, Dv], new_state)`; a masked step leaves the state unchanged.
    """
    dtype = accumulator_dtype(value.dtype)
    q, k, value = (ops.cast(t, dtype) for t in (query_features, key_features, value))
    if mask is not None:
        keep = ops.cast(mask, "bool")[:, None, None]
        k = ops.where(keep, k, 0.0)
        value = ops.where(keep, value, 0.0)
    s, z = state
    s = s + k[..., :, None] * value[..., None, :]
    z = z + k
    numerator = ops.einsum("bhk,bhkv->bhv", q, s)
    denominator = ops.einsum("bhk,bhk->bh", q, z)[..., None]
    return numerator / (denominator + epsilon), (s, z)
