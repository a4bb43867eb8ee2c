"""The windowed forms of `causal_softmax_mean`: each row's mean over its last `window` positions.

    window <= C   banded chunks: each chunk of C rows sees itself and the chunk before (`banded_mean`)
    window >  C   a prefix and a suffix inside chunks, and a windowed mean over the whole chunks
                  between (`block_banded_mean`): one banded pass's cost whatever the window

Means over disjoint spans combine exactly by their normalisers (`merge_means`).
"""

import functools
import operator

from keras import ops

from elita_tf import backend
from elita_tf.ops.utils.documents import document_index
from elita_tf.ops.utils.dtypes import NEG_INF, UNSEEN_LOGIT
from elita_tf.ops.utils.positions import pad_axis, shift_right, static_size


def pad_time(logits, values, multiple):
    """Pads the time axis to a multiple: padded keys get no weight."""
    pad = (-static_size(logits, 2)) % multiple
    return pad_axis(logits, 2, pad, NEG_INF), pad_axis(values, 2, pad)


def banded_mean(logits, values, window, chunk_size, document_starts=None):
    """Windowed mean for `window <= chunk_size`: each chunk sees itself and the one before.

    Row `i` of a chunk sits at key slot `C + i` of `[previous chunk, chunk]`
    and sees slots `(C + i - window, C + i]` (of its own document, with `document_starts [B, T]`).
    """
    b, h, length, depth = (ops.shape(values)[k] for k in range(4))
    logits, values = pad_time(logits, values, chunk_size)
    l = ops.reshape(logits, [b, h, -1, chunk_size])  # [B, H, K, C]
    v = ops.reshape(values, [b, h, -1, chunk_size, depth])
    prev_l = shift_right(l, axis=2, fill=NEG_INF)
    prev_v = shift_right(v, axis=2)
    keys_l = ops.concatenate([prev_l, l], axis=-1)  # [B, H, K, 2C]
    keys_v = ops.concatenate([prev_v, v], axis=-2)  # [B, H, K, 2C, D]
    row = ops.arange(chunk_size, dtype="int32")[:, None] + chunk_size
    col = ops.arange(2 * chunk_size, dtype="int32")[None, :]
    band = ops.logical_and(col <= row, col > row - window)  # [C, 2C]
    if document_starts is not None:
        seg = ops.reshape(document_index(document_starts, chunk_size), [b, 1, -1, chunk_size])  # [B, 1, K, C]
        keys_seg = ops.concatenate([shift_right(seg, axis=2, fill=-1), seg], axis=-1)
        band = ops.logical_and(band, ops.equal(seg[..., :, None], keys_seg[..., None, :]))  # [B, 1, K, C, 2C]
    scores = ops.where(band, keys_l[..., None, :], UNSEEN_LOGIT)
    log_z = ops.logsumexp(scores, axis=-1)  # [B, H, K, C]
    weights = ops.exp(scores - log_z[..., None])
    mean = ops.einsum("bhkij,bhkjd->bhkid", weights, keys_v)
    mean = ops.reshape(mean, [b, h, -1, depth])[:, :, :length]
    return mean, ops.reshape(log_z, [b, h, -1])[:, :, :length]


def merge_means(parts):
    """`(log_z, mean)` of the union of disjoint key sets, from each set's `(log_z, mean)`."""
    log_z = ops.logsumexp(ops.stack([lz for lz, _ in parts], axis=-1), axis=-1)
    # A chain of additions, not sum(): no extra pass of `0 + first` (TensorFlow's graph optimiser makes the
    # chain one AddN, XLA fuses it).
    mean = functools.reduce(operator.add, [ops.exp(lz - log_z)[..., None] * m for lz, m in parts])
    return log_z, mean


def block_banded_mean(logits, values, window, chunk_size):
    """Windowed mean for `window > chunk_size`, at the cost of one banded pass whatever the window.

    With `window = m C + w` (`0 <= w < C`), the window of row `r` of chunk
    `k` is the prefix of chunk `k` up to `r`, a suffix of an earlier chunk,
    and the whole chunks between:

        r >= w - 1:  suffix of chunk k - m from r - w + 1,     m - 1 whole chunks
        r <  w - 1:  suffix of chunk k - m - 1 from r - w + 1 + C,   m whole chunks

    Prefixes and suffixes inside a chunk are `C x C` products; the whole
    chunks are the windowed mean of the chunks' own `(log_z, mean)`, a
    sequence `C` times shorter (this function again, or a banded pass).
    The parts are merged with a log-sum-exp, so every weight stays `<= 1`.
    """
    b, h, length, depth = (ops.shape(values)[k] for k in range(4))
    whole, rest = divmod(window, chunk_size)
    logits, values = pad_time(logits, values, chunk_size)
    l = ops.reshape(logits, [b, h, -1, chunk_size])  # [B, H, K, C]
    v = ops.reshape(values, [b, h, -1, chunk_size, depth])

    rows, keys = ops.arange(chunk_size, dtype="int32")[:, None], ops.arange(chunk_size, dtype="int32")[None, :]
    pre_lz = backend.cumulative_logsumexp(l, axis=-1)
    pre_mean = backend.matmul(ops.exp(ops.where(keys <= rows, l[..., None, :] - pre_lz[..., None], NEG_INF)), v)

    # Row r takes the suffix from offset s_r = (r - w + 1) mod C, `whole` chunks back (or `whole + 1`:
    # rows r < w - 1, which exist for w >= 2); with w = 0, s_r = r + 1 and row C - 1 takes an empty
    # suffix (offset C). Each row's suffix is formed at its own offset, so no row moves afterwards.
    offset = (rows[:, 0] - rest + 1) % chunk_size if rest else rows[:, 0] + 1  # [C], in [0, C]
    suf_lz = backend.cumulative_logsumexp(l, axis=-1, reverse=True)
    suf_lz = ops.take(ops.pad(suf_lz, [[0, 0]] * 3 + [[0, 1]], constant_values=NEG_INF), offset, axis=-1)
    suffix_keys = keys >= offset[:, None]  # [C, C]
    suf_mean = backend.matmul(ops.exp(ops.where(suffix_keys, l[..., None, :] - suf_lz[..., None], NEG_INF)), v)
    suffix = (shift_right(suf_lz, 2, NEG_INF, whole), shift_right(suf_mean, 2, 0.0, whole))

    # Whole chunks k - m + 1 .. k - 1 (and k - m for rows r < w - 1).
    chunk_lz, chunk_mean = pre_lz[..., -1], pre_mean[..., -1, :]  # [B, H, K], [B, H, K, D]
    if whole > 1:
        span_mean, span_lz = windowed_mean(chunk_lz, chunk_mean, whole - 1, chunk_size)
        span = (shift_right(span_lz, 2, NEG_INF), shift_right(span_mean, 2))
    else:
        span = (ops.full_like(chunk_lz, NEG_INF), ops.zeros_like(chunk_mean))

    def to_rows(part):  # a chunk's (log_z, mean), for each of its rows
        return ops.broadcast_to(part[0][..., None], ops.shape(pre_lz)), part[1][:, :, :, None]

    if rest >= 2:
        second_case = ops.arange(chunk_size, dtype="int32") < rest - 1
        suffix = (
            ops.where(second_case, shift_right(suf_lz, 2, NEG_INF, whole + 1), suffix[0]),
            ops.where(second_case[:, None], shift_right(suf_mean, 2, 0.0, whole + 1), suffix[1]),
        )
        oldest = (shift_right(chunk_lz, 2, NEG_INF, whole), shift_right(chunk_mean, 2, 0.0, whole))
        longer, span = to_rows(merge_means([span, oldest])), to_rows(span)
        span = (ops.where(second_case, longer[0], span[0]), ops.where(second_case[:, None], longer[1], span[1]))
    else:
        span = to_rows(span)

    log_z, mean = merge_means([(pre_lz, pre_mean), suffix, span])
    mean = ops.reshape(mean, [b, h, -1, depth])[:, :, :length]
    return mean, ops.reshape(log_z, [b, h, -1])[:, :, :length]


def windowed_mean(logits, values, window, chunk_size):
    """Windowed mean and log-normaliser of `[B, H, T]` logits and `[B, H, T, D]` values."""
    if window <= chunk_size:
        return banded_mean(logits, values, window, chunk_size)
    return block_banded_mean(logits, values, window, chunk_size)
