"""The global causal softmax mean in few, large operations: each chunk's weights taken directly as exponentials.

For key-only logits `l [N, T]` and values `x [N, T, D]`, row `i` of chunk `k` (chunks of `C`):

    m_i   = max_{j<=i in k} l_j                                   the row's running maximum (causal)
    E_ij  = exp(l_j - m_i) for j <= i in k, else 0                 [N, K, C, C], every entry in [0, 1]
    z_i   = Σ_j E_ij >= 1,   A_i = m_i + log z_i                   the chunk's own log-normaliser
    a_i   = Σ_j E_ij x_j / z_i                                     the chunk's own mean
    B_k   = log Σ_{j before k} exp(l_j),   c_k = that mean          the chunks before: the same mean, one level up
    L_i   = logaddexp(B_k, A_i)
    mean_i = exp(B_k - L_i) c_k + exp(A_i - L_i) a_i

Every exponent is `<= 0` and every divisor `>= 1`, for any logits: nothing overflows, and a row
reads positions `<= i` alone, so it is causal to the bit. The chunks' totals `(A_last, a_last)`
are a sequence of `K` items with the same structure: `B_k, c_k` are one `[K, K]` product of them
(or, past 512 chunks, this function one level up, shifted by one chunk).

Against the factored form (`decayed_prefix`), this takes `C` exponentials a position instead of
one, and keeps `E` for the backward pass, but it has no data-dependent choice and a handful of
fused operations a level: under XLA, and on a GPU, what costs is the number of kernels, not the
arithmetic. `causal_softmax_mean` takes it there (`form="direct"`).
"""

import tensorflow as tf

from elita_tf.ops.utils.dtypes import NEG_INF, UNSEEN_LOGIT
from elita_tf.ops.utils.positions import pad_axis, shift_right


def direct_softmax_mean(logits, values, chunk_size):
    """`(mean [N, T, D], log_z [N, T])` of prepared `[N, T]` logits and `[N, T, D]` values; `T` known at tracing.

    Masked positions hold logit `NEG_INF` and value 0 (`causal_softmax_mean` prepares them).
    """
    length, depth = logits.shape[1], values.shape[2]
    if length == 0:
        return tf.zeros_like(values), tf.zeros_like(logits)
    size = min(chunk_size, length)
    pad = -length % size
    chunks = (length + pad) // size
    # Padding at the end: no earlier row sees it, and its rows are cut off below.
    l = tf.reshape(pad_axis(logits, 1, pad, NEG_INF), [-1, chunks, size])  # [N, K, C]
    x = tf.reshape(pad_axis(values, 1, pad), [-1, chunks, size, depth])  # [N, K, C, D]
    causal = tf.range(size)[None, :] <= tf.range(size)[:, None]  # [C, C], j <= i
    scores = tf.where(causal, l[:, :, None, :], tf.constant(UNSEEN_LOGIT, l.dtype))  # [N, K, C, C]
    # The running maximum cancels from the result: no gradient through it.
    peak = tf.stop_gradient(tf.reduce_max(scores, axis=-1))  # [N, K, C]
    weights = tf.exp(scores - peak[..., None])
    z = tf.reduce_sum(weights, axis=-1)
    own_lz = peak + tf.math.log(z)
    own = tf.matmul(weights, x) / z[..., None]  # [N, K, C, D]
    if chunks > 1:
        before_lz, before = _before_each_chunk(own_lz[:, :, -1], own[:, :, -1], chunk_size)  # [N, K], [N, K, D]
        before_lz = before_lz[..., None]
        # logaddexp(before_lz, own_lz), in one elementwise pass: both terms of the sum are at most 1.
        top = tf.maximum(before_lz, own_lz)
        before_weight, own_weight = tf.exp(before_lz - top), tf.exp(own_lz - top)
        total = before_weight + own_weight
        log_z = top + tf.math.log(total)
        mean = (before_weight / total)[..., None] * before[:, :, None, :] + (own_weight / total)[..., None] * own
    else:
        log_z, mean = own_lz, own
    mean = tf.reshape(mean, [-1, chunks * size, depth])[:, :length]
    return mean, tf.reshape(log_z, [-1, chunks * size])[:, :length]


# Chunks whose carries are taken as one `[K, K]` product; past this, one level more of chunks.
_DIRECT_CHUNKS = 512


def _before_each_chunk(totals, means, chunk_size):
    """`(B [N, K], c [N, K, D])`: the log-normaliser and mean of every chunk before chunk `k` (`UNSEEN_LOGIT`
    and an arbitrary mean with no weight for the first), from each chunk's own `totals [N, K]` and `means`."""
    chunks = totals.shape[1]
    if chunks > _DIRECT_CHUNKS:  # inclusive, one level up, shifted by one chunk
        upper_mean, upper_lz = direct_softmax_mean(totals, means, chunk_size)
        return shift_right(upper_lz, axis=1, fill=UNSEEN_LOGIT), shift_right(upper_mean, axis=1)
    earlier = tf.range(chunks)[None, :] < tf.range(chunks)[:, None]  # [K, K], k' < k
    scores = tf.where(earlier, totals[:, None, :], tf.constant(UNSEEN_LOGIT, totals.dtype))  # [N, K, K]
    peak = tf.stop_gradient(tf.reduce_max(scores, axis=-1, keepdims=True))
    weights = tf.exp(scores - peak)
    z = tf.reduce_sum(weights, axis=-1, keepdims=True)  # >= 1
    return peak[..., 0] + tf.math.log(z[..., 0]), tf.matmul(weights / z, means)
