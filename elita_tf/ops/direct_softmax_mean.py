"""The global causal softmax mean in few, large operations: each chunk's weights taken directly as exponentials.

For key-only logits `l [N, T]` and values `x [N, T, D]`, the values get a column of ones,
`v = [x, 1]`, so that one matrix product gives a row's weighted sum and its normaliser together.
Row `i` of chunk `k` (chunks of `C`):

    m_i = max_{j<=i in k} l_j                          the row's running maximum (causal)
    s_i = Σ_{j<=i in k} exp(l_j - m_i) v_j             one [C, C] x [C, D + 1] product; last column >= 1
    p_k, S_k = the same sums over the chunks before k, one level up: logits m_last, values s_last
    r_i = max(p_k, m_i)
    u_i = exp(p_k - r_i) S_k + exp(m_i - r_i) s_i       = Σ_{j<=i} exp(l_j - r_i) v_j
    mean_i = u_i[:D] / u_i[D],    log_z_i = r_i + log u_i[D]

Every exponent is `<= 0` and the divisor `u_i[D]` is at least 1 (the term whose reference is
`r_i` holds a weight of exactly 1), for any logits; a row reads positions `<= i` alone, so it is
causal to the bit. The references `m`, `p`, `r` cancel from every result: no gradient goes
through them. The sums stay unnormalised until the last step, so the two levels and the final
mean are few fused operations; past 512 chunks the chunk level is this function one level up.

Against the factored form (`decayed_prefix`), this takes `C` exponentials a position instead of
one, and keeps the weights for the backward pass, but it has no data-dependent choice and a
handful of fused operations a level: under XLA, and on a GPU, what costs is the number of
kernels, not the arithmetic. `causal_softmax_mean` takes it there (`form="direct"`).
"""

from keras import ops

from elita_tf import backend

from elita_tf.ops.utils.dtypes import NEG_INF, UNSEEN_LOGIT
from elita_tf.ops.utils.positions import pad_axis, shift_right


def direct_softmax_mean(logits, values, chunk_size):
    """`(mean [N, T, D], log_z [N, T])` of prepared `[N, T]` logits and `[N, T, D]` values; `T` known at tracing.

    Masked positions hold logit `NEG_INF` and value 0 (`causal_softmax_mean` prepares them).
    """
    length, depth = logits.shape[1], values.shape[2]
    if length == 0:
        return ops.zeros_like(values), ops.zeros_like(logits)
    ones = ops.ones_like(values[..., :1])
    reference, sums = _causal_sums(logits, ops.concatenate([values, ones], axis=-1), chunk_size)
    normaliser = sums[..., depth]  # >= 1
    return sums[..., :depth] / normaliser[..., None], reference + ops.log(normaliser)


def _causal_sums(logits, values, chunk_size):
    """`(r [N, T], Σ_{j<=i} exp(l_j - r_i) v_j [N, T, E])`, with `r_i` the running maximum (no gradient)."""
    length, width = logits.shape[1], values.shape[2]
    size = min(chunk_size, length)
    pad = -length % size
    chunks = (length + pad) // size
    # Padding at the end: no earlier row sees it, and its rows are cut off below.
    l = ops.reshape(pad_axis(logits, 1, pad, NEG_INF), [-1, chunks, size])  # [N, K, C]
    v = ops.reshape(pad_axis(values, 1, pad), [-1, chunks, size, width])  # [N, K, C, E]
    causal = ops.arange(size, dtype="int32")[None, :] <= ops.arange(size, dtype="int32")[:, None]  # [C, C], j <= i
    scores = ops.where(causal, l[:, :, None, :], UNSEEN_LOGIT)  # [N, K, C, C]
    reference = ops.stop_gradient(ops.max(scores, axis=-1))  # [N, K, C]
    sums = backend.matmul(ops.exp(scores - reference[..., None]), v)  # [N, K, C, E]
    if chunks > 1:
        before_reference, before = _before_each_chunk(reference[:, :, -1], sums[:, :, -1], chunk_size)
        before_reference = before_reference[..., None]  # [N, K, 1]
        top = backend.maximum(before_reference, reference)
        sums = (
            ops.exp(before_reference - top)[..., None] * before[:, :, None] + ops.exp(reference - top)[..., None] * sums
        )
        reference = top
    reference = ops.reshape(reference, [-1, chunks * size])[:, :length]
    return reference, ops.reshape(sums, [-1, chunks * size, width])[:, :length]


# Chunks whose carries are taken as one `[K, K]` product; past this, one level more of chunks.
_MOST_CHUNKS_IN_ONE_PRODUCT = 512


def _before_each_chunk(references, sums, chunk_size):
    """`(p [N, K], S [N, K, E])`: the sums of every chunk before chunk `k` against reference `p_k`, from each
    chunk's own last-row `references [N, K]` and `sums`. Chunk 0 gets `p = UNSEEN_LOGIT`, so no weight."""
    chunks = references.shape[1]
    if chunks > _MOST_CHUNKS_IN_ONE_PRODUCT:  # inclusive, one level up, shifted by one chunk
        upper_reference, upper = _causal_sums(references, sums, chunk_size)
        return shift_right(upper_reference, axis=1, fill=UNSEEN_LOGIT), shift_right(upper, axis=1)
    earlier = ops.arange(chunks, dtype="int32")[None, :] < ops.arange(chunks, dtype="int32")[:, None]  # [K, K], k' < k
    scores = ops.where(earlier, references[:, None, :], UNSEEN_LOGIT)  # [N, K, K]
    reference = ops.stop_gradient(ops.max(scores, axis=-1))
    return reference, backend.matmul(ops.exp(scores - reference[..., None]), sums)
