"""Stable causal softmax-weighted means with key-only logits (docs/math.md §1).

For logits `l [B, H, T]` and values `x [B, H, T, D]` row `i` is

    mean_i = Σ_{j∈W(i)} exp(l_j) x_j / Σ_{j∈W(i)} exp(l_j)
    logZ_i = log Σ_{j∈W(i)} exp(l_j)

with `W(i) = {j <= i}` (global) or the last `window` positions (windowed):

    global          window = 3
    row 0: x . . .  x . . . .
    row 1: x x . .  x x . . .
    row 2: x x x .  x x x . .
    row 3: x x x x  . x x x .

This is the shared primitive of ELiTA `Attention2` and additive attention.

Every exponent taken here is `l_j - L_i <= 0` with `L_i` a log-sum-exp
over a set that holds `l_j`: nothing overflows for any logit range, and there
is no cumulative sum difference that can cancel. All arithmetic is float32
(float64 stays float64) whatever the input dtype.

Forms:
- `causal_softmax_mean`: the parallel training form. Chunks of `C` positions
  are combined with `C x C` matrix products; chunks are linked by the same
  scheme one level up (chunks of chunks), and the few top-level blocks by
  one more product. Inside a chunk, `L` and the weights are factored around
  the chunk's first normaliser (`_chunk_factors`), exact while no logit
  rises more than a span above it; rows past one take the exponential
  forms. Time and memory are O(T * C * D) for the global
  case and for every window size (windowed: banded chunks for
  `window <= C`; beyond, a prefix and a suffix inside chunks with a
  windowed mean over the whole chunks between, the same cost).
- `causal_softmax_mean_step`: the one-step recurrent form for decoding, from a
  constant-size state (global) or a ring buffer of `window` entries.
"""

from typing import Callable, NamedTuple

import tensorflow as tf

from elita_tf.ops.utils import (
    NEG_INF,
    accumulator_dtype,
    branch_or_select,
    gated_scan,
    outer_product,
    pad_axis,
    real_extent,
    segment_ids,
    window_after,
)

# Floor for log(|x|) in the sign-split carry: adds at most 1e-30 to a mean.
_TINY = 1e-30

DEFAULT_CHUNK_SIZE = 32

# The logit of a key a row must not see: far below a masked key's NEG_INF, so that a row that sees
# only masked keys (normaliser NEG_INF, so `l_j - L_i` about -NEG_INF) still gives it no weight.
# Finite in float32.
_UNSEEN_LOGIT = 1e8 * NEG_INF


def logaddexp(a, b):
    """`log(exp(a) + exp(b))`, broadcasting, with the right gradient at ties."""
    a, b = a + tf.zeros_like(b), b + tf.zeros_like(a)
    return tf.reduce_logsumexp(tf.stack([a, b], axis=-1), axis=-1)


def empty_state(batch_size, num_heads, head_dim, window=None, dtype=tf.float32):
    """The state before any position, for `causal_softmax_mean(_step)`.

    Returns:
        Global (`window=None`): `(log_z [B, H], mean [B, H, D])`, the running
        normaliser and mean. Windowed: `(logits [B, H, window],
        values [B, H, window, D])`, a ring buffer of the last `window` inputs
        (oldest first).
    """
    dtype = accumulator_dtype(dtype)
    if window is None:
        log_z = tf.fill([batch_size, num_heads], tf.constant(NEG_INF, dtype))
        return log_z, tf.zeros([batch_size, num_heads, head_dim], dtype)
    logits = tf.fill([batch_size, num_heads, window], tf.constant(NEG_INF, dtype))
    return logits, tf.zeros([batch_size, num_heads, window, head_dim], dtype)


def _check_window(window):
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"`window` must be None or a positive integer. Received: window={window}")


def _prepare(logits, values, mask):
    """Casts to the accumulator dtype; masked positions get no weight and zero value."""
    dtype = accumulator_dtype(values.dtype)
    logits = tf.cast(logits, dtype)
    values = tf.cast(values, dtype)
    if mask is not None:
        mask = tf.cast(mask, tf.bool)[:, None, :]  # [B, 1, T]
        logits = tf.where(mask, logits, tf.constant(NEG_INF, dtype))
        values = tf.where(mask[..., None], values, tf.zeros([], dtype))
    return logits, values


def _size(x, axis):
    """`x`'s size along `axis`: a Python int when the shape is known at tracing, else a tensor."""
    return x.shape[axis] if x.shape[axis] is not None else tf.shape(x)[axis]


def _pad_time(logits, values, multiple):
    """Pads the time axis to a multiple: padded keys get no weight."""
    pad = (-_size(logits, 2)) % multiple
    return pad_axis(logits, 2, pad, NEG_INF), pad_axis(values, 2, pad)


def _leading(x, length):
    """`x[:, :length]`, or `x` itself when that is all of it at tracing: no slice, whose gradient is a full copy."""
    if isinstance(length, int) and x.shape[1] == length:
        return x
    return x[:, :length]


def _shift_right(x, axis, fill=0.0, steps=1):
    """`x` moved `steps` along `axis`, `fill` entering at the start (safe for any size).

    A pad and a slice: their gradients are a slice and a pad, not a scatter.
    """
    pad = [[0, 0]] * x.shape.rank
    pad[axis] = [steps, 0]
    padded = tf.pad(x, pad, constant_values=fill)
    return tf.slice(padded, tf.zeros_like(tf.shape(x)), tf.shape(x))


# How far a logit may rise above its chunk's reference for the factored weights: `exp(span)`, and
# `1 / (1 + C exp(span))`, stay normal numbers (float32's range ends near e^±87, float64's near e^±708).
_SPAN = {tf.float32: 80.0, tf.float64: 700.0}


class _Factors(NamedTuple):
    """A chunked sequence's `L = logcumsumexp(l)` and the factors of its chunk weights (`_chunk_factors`)."""

    log_z: tf.Tensor  # [N, K, C]
    rows: tf.Tensor  # [N, K, C], exp(r - L_i)
    keys: tf.Tensor  # [N, K, C], exp(l_j - r)
    within: tf.Tensor  # scalar bool: every row's factors are exact
    exact_rows: Callable  # () -> bool [N, K, C], the rows whose factors are exact


def _chunk_factors(logits):
    """`L = logcumsumexp(l)` of `logits [N, K, C]` (chunks in order), and factors of `exp(l_j - L_i)`.

    Chunk `k` takes the reference `r = logaddexp(L_before, l_first)`, its
    first row's `L`: the normaliser of everything before the chunk
    (`L_before`, a `cumulative_logsumexp` over the chunks' own totals) and
    of the chunk's first position. Then for row `i` of the chunk

        Z_i = exp(L_before - r) + Σ_{j<=i} exp(l_j - r)     L_i = r + log Z_i
        exp(l_j - L_i) = (1 / Z_i) exp(l_j - r)

    The prefix sums are one product with a triangle of ones, `Z_i >= 1`
    (its first two terms sum to 1), and every factor is a normal number as
    long as no logit of the chunk up to row `i` rises more than the span
    (`_SPAN`) above `r`. Rows past such a logit are not `exact_rows()`:
    their `L` and weights are taken from the exponential forms instead. A
    row's reference and factors depend on positions `<= i` only, so which
    form a row takes, and every bit of it, is causal.
    """
    span = _SPAN[logits.dtype]
    peak = tf.stop_gradient(tf.reduce_max(logits, axis=-1, keepdims=True))
    totals = peak[..., 0] + tf.math.log(tf.reduce_sum(tf.exp(logits - peak), axis=-1))  # [N, K]
    before = _shift_right(tf.math.cumulative_logsumexp(totals, axis=1), axis=1, fill=NEG_INF)
    ref = tf.stop_gradient(logaddexp(before, logits[..., 0]))[..., None]  # cancels from L and its gradient
    rise = logits - ref
    # Clamped: a row past a too-high logit takes the exponential forms, but its factors stay finite.
    keys = tf.exp(tf.minimum(rise, span))
    size = logits.shape[-1]
    upper = tf.cast(tf.range(size)[:, None] <= tf.range(size)[None, :], logits.dtype)  # [C, C], j <= i
    z = tf.exp(before[..., None] - ref) + tf.matmul(keys, upper)  # [N, K, C], >= 1

    too_high = rise > span  # a bool, not `rise`, is what the rows' check keeps until the backward pass

    def exact_rows():  # built where it is needed: on a CPU without XLA, only in the branch that needs it
        return tf.equal(tf.matmul(tf.cast(too_high, logits.dtype), upper), 0.0)

    within = tf.logical_not(tf.reduce_any(too_high))
    return _Factors(ref + tf.math.log(z), tf.math.reciprocal(z), keys, within, exact_rows)


def _chunk_products(log_w, log_norm, items, block_size, factors=None):
    """`Σ_{j<=i} exp(a_j - L_i) x_j` in each chunk: `[N, K, C]` logits `a` and norms `L`, items `[N, K, C, D]`.

    The `C x C` weights are the largest tensor of the forward pass, so the
    backward pass recomputes them (a subtraction and an exponential) rather
    than keep them: `C x C` values a chunk less memory held until then. Their
    gradient needs no mask either: it is `(dE xᵀ) * weights`, zero wherever
    the weights are.

    With `factors` (`_chunk_factors` of `a`, whose `log_z` is `L`), a weight is the product
    `rows_i keys_j`: an outer product and the causal mask, two passes over `[N, K, C, C]`
    instead of a subtraction, a bias and an exponential. Rows whose factors are not exact take
    the exponential form.
    """
    causal = tf.range(block_size)[None, :] <= tf.range(block_size)[:, None]  # [C, C]
    # Added, not selected: a select broadcast to `[N, K, C, C]` is the slowest pass here.
    mask_bias = tf.where(causal, tf.constant(0.0, log_w.dtype), tf.constant(_UNSEEN_LOGIT, log_w.dtype))

    def weights(log_w, log_norm):
        def exponential():
            return tf.exp(log_w[:, :, None, :] - log_norm[..., None] + mask_bias)

        if factors is None:
            return exponential()

        def factored():
            # band_part keeps the lower triangle in one pass: 1.8 against 3.0 ms for multiplying
            # by the mask at T = 16K on a CPU. The factors are finite and >= 0: the same values.
            return tf.linalg.band_part(outer_product(factors.rows, factors.keys), -1, 0)

        return branch_or_select(
            factors.within, factored, lambda: tf.where(factors.exact_rows()[..., None], factored(), exponential())
        )

    @tf.custom_gradient
    def products(log_w, log_norm, items):
        def grad(upstream):
            with tf.name_scope("causal_mean_gradient"):
                with tf.control_dependencies([upstream]):  # else every block recomputes its weights at once, early
                    w = weights(log_w, log_norm)
                d_scores = tf.matmul(upstream, items, transpose_b=True) * w  # [N, K, C, C]
                d_items = tf.matmul(w, upstream, transpose_a=True)
                return tf.reduce_sum(d_scores, -2), -tf.reduce_sum(d_scores, -1), d_items

        return tf.matmul(weights(log_w, log_norm), items), grad

    return products(log_w, log_norm, items)


def _decayed_prefix(log_norm, items, block_size, levels, item_logits=None, factors=None):
    """`E_k = Σ_{j<=k} exp(a_j - log_norm_k) items_j` for nondecreasing `log_norm`.

    `log_norm [N, K]`, `items [N, K, D]`; `a = item_logits [N, K]`, by
    default `log_norm`. Each `a_j <= log_norm_k` for `j <= k`, so every weight
    is `<= 1`. Blocks of `block_size` are combined with matrix products; the
    carry between blocks is the same sum one level up (the blocks' last rows,
    whose weights are their own `log_norm`). A sequence known at tracing to
    fit in one block is one product; the top level of a longer or unknown
    one is a sign-split `cumulative_logsumexp`, cheap on so few entries.
    `factors` (`_chunk_factors`) are this level's, already in blocks.
    """
    log_w = log_norm if item_logits is None else item_logits
    length, depth = _size(items, 1), _size(items, 2)
    if isinstance(length, int) and length <= block_size:
        return _chunk_products(log_w[:, None], log_norm[:, None], items[:, None], length, factors)[:, 0]
    if levels == 0:
        log_pos = tf.math.cumulative_logsumexp(log_w[..., None] + tf.math.log(tf.maximum(items, _TINY)), axis=1)
        log_neg = tf.math.cumulative_logsumexp(log_w[..., None] + tf.math.log(tf.maximum(-items, _TINY)), axis=1)
        return tf.exp(log_pos - log_norm[..., None]) - tf.exp(log_neg - log_norm[..., None])
    pad = (-length) % block_size
    if not (isinstance(pad, int) and pad == 0):
        # Padding repeats the last log_norm (length >= 1 here): weights stay <= 1.
        log_norm = tf.gather(log_norm, tf.minimum(tf.range(length + pad), length - 1), axis=1)
    lz = tf.reshape(log_norm, [-1, (length + pad) // block_size, block_size])  # [N, K, C]
    x = tf.reshape(pad_axis(items, 1, pad), [-1, (length + pad) // block_size, block_size, depth])  # [N, K, C, D]
    # Padded items are zero and get no weight.
    log_w = tf.reshape(pad_axis(log_w, 1, pad, NEG_INF), [-1, (length + pad) // block_size, block_size])

    inner = _chunk_products(log_w, lz, x, block_size, factors)  # [N, K, C, D]
    # Carry: everything before each block, decayed to the block's rows.
    carry = _decayed_prefix(lz[..., -1], inner[:, :, -1], block_size, levels - 1)
    prev_lz = _shift_right(lz[..., -1], axis=1, fill=NEG_INF)
    prev = _shift_right(carry, axis=1)
    # An outer product per chunk (`outer_product`): its gradients are matrix-vector products rather
    # than `[N, K, C, D]` products to be summed.
    out = inner + outer_product(tf.exp(prev_lz[..., None] - lz), prev)
    return _leading(tf.reshape(out, [-1, length + pad, depth]), length)


def _global_chunked(logits, values, chunk_size):
    """Global causal mean of `[N, T]` logits and `[N, T, D]` values.

    With `L_i = logcumsumexp(l)_i`, the mean is `Σ_{j<=i} exp(l_j - L_i) x_j`:
    a decayed prefix sum with weights <= 1, done in chunks at two levels
    (tokens, then chunks). The values enter the chunks' matrix products as
    they are, with no weighted copy of them first.
    """
    length = _size(logits, 1)
    # At least one chunk, so that T = 0 needs no special case below.
    if isinstance(length, int):
        pad = (-length) % chunk_size + (chunk_size if length == 0 else 0)
    else:
        pad = (-length) % chunk_size + chunk_size * tf.cast(tf.equal(length, 0), tf.int32)
    logits = pad_axis(logits, 1, pad, NEG_INF)
    values = pad_axis(values, 1, pad)
    factors = _chunk_factors(tf.reshape(logits, [-1, (length + pad) // chunk_size, chunk_size]))
    factored_log_z = tf.reshape(factors.log_z, tf.shape(logits))  # [N, T']
    log_z = branch_or_select(
        factors.within,
        lambda: factored_log_z,
        lambda: tf.where(
            tf.reshape(factors.exact_rows(), tf.shape(logits)),
            factored_log_z,
            tf.math.cumulative_logsumexp(logits, axis=-1),
        ),
    )
    mean = _decayed_prefix(log_z, values, chunk_size, levels=2, item_logits=logits, factors=factors)
    return _leading(mean, length), _leading(log_z, length)


def _global(logits, values, chunk_size):
    """Global causal mean of `[B, H, T]` logits and `[B, H, T, D]` values."""
    shape = tf.shape(values)
    length, depth = _size(values, 2), _size(values, 3)  # static where known, so pads and slices can be left out
    mean, log_z = _global_chunked(tf.reshape(logits, [-1, length]), tf.reshape(values, [-1, length, depth]), chunk_size)
    return tf.reshape(mean, shape), tf.reshape(log_z, shape[:3])


def _banded(logits, values, window, chunk_size, resets=None):
    """Windowed mean for `window <= chunk_size`: each chunk sees itself and the one before.

    Row `i` of a chunk sits at key slot `C + i` of `[previous chunk, chunk]`
    and sees slots `(C + i - window, C + i]` (of its own document, with `resets [B, T]`).
    """
    b, h, length, depth = (tf.shape(values)[k] for k in range(4))
    logits, values = _pad_time(logits, values, chunk_size)
    l = tf.reshape(logits, [b, h, -1, chunk_size])  # [B, H, K, C]
    v = tf.reshape(values, [b, h, -1, chunk_size, depth])
    prev_l = _shift_right(l, axis=2, fill=NEG_INF)
    prev_v = _shift_right(v, axis=2)
    keys_l = tf.concat([prev_l, l], axis=-1)  # [B, H, K, 2C]
    keys_v = tf.concat([prev_v, v], axis=-2)  # [B, H, K, 2C, D]
    row = tf.range(chunk_size)[:, None] + chunk_size
    col = tf.range(2 * chunk_size)[None, :]
    band = (col <= row) & (col > row - window)  # [C, 2C]
    if resets is not None:
        seg = tf.reshape(segment_ids(resets, chunk_size), [b, 1, -1, chunk_size])  # [B, 1, K, C]
        keys_seg = tf.concat([_shift_right(seg, axis=2, fill=-1), seg], axis=-1)
        band = band & tf.equal(seg[..., :, None], keys_seg[..., None, :])  # [B, 1, K, C, 2C]
    scores = tf.where(band, keys_l[..., None, :], tf.constant(_UNSEEN_LOGIT, l.dtype))
    log_z = tf.reduce_logsumexp(scores, axis=-1)  # [B, H, K, C]
    weights = tf.exp(scores - log_z[..., None])
    mean = tf.einsum("bhkij,bhkjd->bhkid", weights, keys_v)
    mean = tf.reshape(mean, [b, h, -1, depth])[:, :, :length]
    return mean, tf.reshape(log_z, [b, h, -1])[:, :, :length]


def _merge(parts):
    """`(log_z, mean)` of the union of disjoint key sets, from each set's `(log_z, mean)`."""
    log_z = tf.reduce_logsumexp(tf.stack([lz for lz, _ in parts], axis=-1), axis=-1)
    # add_n, not sum(): one op, without sum()'s extra pass of `0 + first`.
    mean = tf.add_n([tf.exp(lz - log_z)[..., None] * m for lz, m in parts])
    return log_z, mean


def _block_banded(logits, values, window, chunk_size):
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
    b, h, length, depth = (tf.shape(values)[k] for k in range(4))
    whole, rest = divmod(window, chunk_size)
    logits, values = _pad_time(logits, values, chunk_size)
    l = tf.reshape(logits, [b, h, -1, chunk_size])  # [B, H, K, C]
    v = tf.reshape(values, [b, h, -1, chunk_size, depth])
    neg_inf = tf.constant(NEG_INF, l.dtype)

    rows, keys = tf.range(chunk_size)[:, None], tf.range(chunk_size)[None, :]
    pre_lz = tf.math.cumulative_logsumexp(l, axis=-1)
    pre_mean = tf.matmul(tf.exp(tf.where(keys <= rows, l[..., None, :] - pre_lz[..., None], neg_inf)), v)

    # Row r takes the suffix from offset s_r = (r - w + 1) mod C, `whole` chunks back (or `whole + 1`:
    # rows r < w - 1, which exist for w >= 2); with w = 0, s_r = r + 1 and row C - 1 takes an empty
    # suffix (offset C). Each row's suffix is formed at its own offset, so no row moves afterwards.
    offset = (rows[:, 0] - rest + 1) % chunk_size if rest else rows[:, 0] + 1  # [C], in [0, C]
    suf_lz = tf.math.cumulative_logsumexp(l, axis=-1, reverse=True)
    suf_lz = tf.gather(tf.pad(suf_lz, [[0, 0]] * 3 + [[0, 1]], constant_values=NEG_INF), offset, axis=-1)
    suffix_keys = keys >= offset[:, None]  # [C, C]
    suf_mean = tf.matmul(tf.exp(tf.where(suffix_keys, l[..., None, :] - suf_lz[..., None], neg_inf)), v)
    suffix = (_shift_right(suf_lz, 2, NEG_INF, whole), _shift_right(suf_mean, 2, 0.0, whole))

    # Whole chunks k - m + 1 .. k - 1 (and k - m for rows r < w - 1).
    chunk_lz, chunk_mean = pre_lz[..., -1], pre_mean[..., -1, :]  # [B, H, K], [B, H, K, D]
    if whole > 1:
        span_mean, span_lz = _windowed(chunk_lz, chunk_mean, whole - 1, chunk_size)
        span = (_shift_right(span_lz, 2, NEG_INF), _shift_right(span_mean, 2))
    else:
        span = (tf.fill(tf.shape(chunk_lz), neg_inf), tf.zeros_like(chunk_mean))

    def to_rows(part):  # a chunk's (log_z, mean), for each of its rows
        return tf.broadcast_to(part[0][..., None], tf.shape(pre_lz)), part[1][:, :, :, None]

    if rest >= 2:
        second_case = tf.range(chunk_size) < rest - 1
        suffix = (
            tf.where(second_case, _shift_right(suf_lz, 2, NEG_INF, whole + 1), suffix[0]),
            tf.where(second_case[:, None], _shift_right(suf_mean, 2, 0.0, whole + 1), suffix[1]),
        )
        oldest = (_shift_right(chunk_lz, 2, NEG_INF, whole), _shift_right(chunk_mean, 2, 0.0, whole))
        longer, span = to_rows(_merge([span, oldest])), to_rows(span)
        span = (tf.where(second_case, longer[0], span[0]), tf.where(second_case[:, None], longer[1], span[1]))
    else:
        span = to_rows(span)

    log_z, mean = _merge([(pre_lz, pre_mean), suffix, span])
    mean = tf.reshape(mean, [b, h, -1, depth])[:, :, :length]
    return mean, tf.reshape(log_z, [b, h, -1])[:, :, :length]


def _global_with_resets(logits, values, resets, initial_state, chunk_size):
    """Global mean where documents start at `resets [B, T]`; returns `(mean, log_z, state)`.

    Inside a chunk, a `C x C` product over the keys of the row's own
    document. Between chunks, each chunk's last-document statistics are
    merged by a `gated_scan` that restarts at every chunk with a reset; a
    row reads the state before its chunk only if its document was open
    then. Every exponent is still `<= 0`.
    """
    b, h, length, depth = (tf.shape(values)[k] for k in range(4))
    lz0, mean0 = (tf.cast(t, values.dtype) for t in initial_state)
    logits, values = _pad_time(logits, values, chunk_size)
    l = tf.reshape(logits, [b, h, -1, chunk_size])  # [B, H, K, C]
    v = tf.reshape(values, [b, h, -1, chunk_size, depth])
    seg = tf.reshape(segment_ids(resets, chunk_size), [b, 1, -1, chunk_size])  # [B, 1, K, C]
    causal = tf.range(chunk_size)[None, :] <= tf.range(chunk_size)[:, None]
    visible = causal & tf.equal(seg[..., :, None], seg[..., None, :])
    scores = tf.where(visible, l[..., None, :], tf.constant(_UNSEEN_LOGIT, l.dtype))  # [B, H, K, C, C]
    log_z = tf.reduce_logsumexp(scores, axis=-1)
    mean = tf.matmul(tf.exp(scores - log_z[..., None]), v)

    last = seg[..., -1]  # each chunk's last document; before the first chunk, the initial state's (0)
    before_last = tf.pad(last, [[0, 0], [0, 0], [1, 0]])[..., :-1]
    gates = tf.concat([tf.zeros_like(last[..., :1], tf.bool), tf.equal(last, before_last)], axis=2)
    gates = tf.broadcast_to(gates, tf.concat([[b, h], tf.shape(gates)[2:]], 0))
    after_lz, after_mean = gated_scan(
        gates,
        (tf.concat([lz0[:, :, None], log_z[..., -1]], 2), tf.concat([mean0[:, :, None], mean[..., -1, :]], 2)),
        lambda earlier, later: _merge([earlier, later]),
        axis=2,
    )
    carried = tf.equal(seg, before_last[..., None])  # [B, 1, K, C]
    previous = (tf.where(carried, after_lz[:, :, :-1, None], NEG_INF), after_mean[:, :, :-1, None, :])
    log_z, mean = _merge([previous, (log_z, mean)])
    mean = tf.reshape(mean, [b, h, -1, depth])[:, :, :length]
    log_z = tf.reshape(log_z, [b, h, -1])[:, :, :length]
    return mean, log_z, (after_lz[:, :, -1], after_mean[:, :, -1])


def _windowed(logits, values, window, chunk_size):
    """Windowed mean and log-normaliser of `[B, H, T]` logits and `[B, H, T, D]` values."""
    if window <= chunk_size:
        return _banded(logits, values, window, chunk_size)
    return _block_banded(logits, values, window, chunk_size)


def causal_softmax_mean(
    logits,
    values,
    window=None,
    mask=None,
    initial_state=None,
    chunk_size=DEFAULT_CHUNK_SIZE,
    resets=None,
):
    """Causal (windowed) softmax-weighted mean, parallel over time.

    Args:
        logits: float tensor `[B, H, T]`. Key-only logits, any range.
        values: float tensor `[B, H, T, D]`.
        window: `None` (every earlier position) or a positive int, the number
            of most recent positions each row sees (itself included).
        mask: optional bool `[B, T]`, False at padding: a padded position adds
            nothing to any later row (its own row is left finite, not
            meaningful). A window's state ends at the last real position:
            right padding is not part of the sequence.
        initial_state: optional state of the positions before these, as from
            `empty_state()` or a previous call (prefill then continue).
        chunk_size: int `C`, positions per matrix-product chunk.
        resets: optional bool `[B, T]`, True where a new document starts:
            from there on nothing before it (the initial state included) is
            seen, and the returned state holds the last document alone.
            Windows longer than `C` then take banded chunks of the window's
            length (cost growing with the window).

    Returns:
        `(mean, log_z, state)`: `mean [B, H, T, D]` in the accumulator dtype
        (float32 unless the values are float64), `log_z [B, H, T]`, and the
        state after the last position, to continue from.
    """
    _check_window(window)
    end = real_extent(mask, tf.shape(logits)[-1])
    logits, values = _prepare(logits, values, mask)
    if resets is not None:
        return _with_resets(logits, values, window, initial_state, chunk_size, resets, end)
    if window is not None and initial_state is not None:
        # The ring buffer holds the `window` positions before these.
        buf_l, buf_v = initial_state
        logits = tf.concat([tf.cast(buf_l, logits.dtype), logits], axis=-1)
        values = tf.concat([tf.cast(buf_v, values.dtype), values], axis=-2)
    if window is None:
        mean, log_z = _global(logits, values, chunk_size)
    else:
        mean, log_z = _windowed(logits, values, window, chunk_size)

    if window is not None:
        if initial_state is None:
            b, h, _, d = (tf.shape(values)[k] for k in range(4))
            empty_l, empty_v = empty_state(b, h, d, window, values.dtype)
            logits = tf.concat([empty_l, logits], axis=-1)
            values = tf.concat([empty_v, values], axis=-2)
        else:
            mean, log_z = mean[:, :, window:], log_z[:, :, window:]
        return mean, log_z, (window_after(logits, end, window, axis=2), window_after(values, end, window, axis=2))

    if initial_state is None:
        b, h, _, d = (tf.shape(values)[k] for k in range(4))
        initial_state = empty_state(b, h, d, None, values.dtype)
    else:
        # Merge the running state of earlier positions into every row.
        lz0 = tf.cast(initial_state[0], log_z.dtype)[..., None]
        mean0 = tf.cast(initial_state[1], mean.dtype)[:, :, None, :]
        merged = logaddexp(lz0, log_z)
        mean = tf.exp(lz0 - merged)[..., None] * mean0 + tf.exp(log_z - merged)[..., None] * mean
        log_z = merged
        initial_state = (lz0[..., 0], mean0[:, :, 0])
    # The last row's statistics, or the initial state when T = 0 (only the last row is copied).
    state = (
        tf.concat([initial_state[0][..., None], log_z[..., -1:]], axis=-1)[..., -1],
        tf.concat([initial_state[1][:, :, None], mean[:, :, -1:]], axis=2)[:, :, -1],
    )
    return mean, log_z, state


def _with_resets(logits, values, window, initial_state, chunk_size, resets, end):
    """`causal_softmax_mean` on prepared inputs where documents start at `resets`."""
    b, h, d = tf.shape(values)[0], tf.shape(values)[1], tf.shape(values)[3]
    if initial_state is None:
        initial_state = empty_state(b, h, d, window, values.dtype)
    if window is None:
        return _global_with_resets(logits, values, resets, initial_state, chunk_size)
    # The ring buffer first, as the initial state's document (no reset in it).
    logits = tf.concat([tf.cast(initial_state[0], logits.dtype), logits], axis=-1)
    values = tf.concat([tf.cast(initial_state[1], values.dtype), values], axis=-2)
    resets = tf.concat([tf.zeros([b, window], tf.bool), tf.cast(resets, tf.bool)], axis=1)
    mean, log_z = _banded(logits, values, window, max(window, chunk_size), resets)
    # The state keeps the last document's positions alone.
    seg = segment_ids(resets)
    end = tf.broadcast_to(end, [b])
    last = tf.gather(seg, end + window - 1, batch_dims=1)
    own = tf.equal(seg, last[:, None])[:, None]  # [B, 1, window + T]
    logits = tf.where(own, logits, NEG_INF)
    values = tf.where(own[..., None], values, tf.zeros([], values.dtype))
    state = (window_after(logits, end, window, axis=2), window_after(values, end, window, axis=2))
    return mean[:, :, window:], log_z[:, :, window:], state


def causal_softmax_mean_step(state, logit, value, window=None, mask=None):
    """One decoding step of `causal_softmax_mean`.

    Args:
        state: the state from `empty_state()`, `causal_softmax_mean` or a
            previous step.
        logit: float `[B, H]`, the new position's logit.
        value: float `[B, H, D]`, its value.
        window: as in `causal_softmax_mean`; must match the state.
        mask: optional bool `[B]`; False leaves a global state unchanged and
            pushes an empty slot into a window.

    Returns:
        `(mean [B, H, D], log_z [B, H], new_state)`, equal to the last row of
        `causal_softmax_mean` over all positions so far.
    """
    _check_window(window)
    logit, value = _prepare(logit[..., None], value[:, :, None, :], None if mask is None else mask[:, None])
    logit, value = logit[..., 0], value[:, :, 0]
    if window is None:
        log_z, mean = state
        new_log_z = logaddexp(log_z, logit)
        # Online mean: the weight exp(l - L) is in [0, 1], so it never overflows.
        new_mean = mean + tf.exp(logit - new_log_z)[..., None] * (value - mean)
        if mask is not None:
            keep = tf.cast(mask, tf.bool)[:, None]
            new_log_z = tf.where(keep, new_log_z, log_z)
            new_mean = tf.where(keep[..., None], new_mean, mean)
        return new_mean, new_log_z, (new_log_z, new_mean)
    buf_l, buf_v = state
    buf_l = tf.concat([buf_l[:, :, 1:], logit[..., None]], axis=-1)
    buf_v = tf.concat([buf_v[:, :, 1:], value[:, :, None]], axis=2)
    log_z = tf.reduce_logsumexp(buf_l, axis=-1)
    mean = tf.einsum("bhw,bhwd->bhd", tf.exp(buf_l - log_z[..., None]), buf_v)
    return mean, log_z, (buf_l, buf_v)
