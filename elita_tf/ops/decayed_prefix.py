"""Exact decayed prefix sums in chunks: the machinery under `causal_softmax_mean` (docs/math.md §1).

For nondecreasing normalisers `L` and logits `a_j <= L_k`, `E_k = Σ_{j<=k} exp(a_j - L_k) x_j` is
taken in chunks of `C` positions: inside a chunk one `C x C` matrix product (`chunk_products`),
whose weights are factored around the chunk's first normaliser where that is exact
(`chunk_factors`); between chunks the same sum one level up (`decayed_prefix`). Every exponent is
`<= 0`: nothing overflows, and no cumulative sum is ever subtracted from another.
"""

from typing import Any, Callable, NamedTuple

import keras
from keras import ops

from elita_tf import backend
from elita_tf.ops.pairwise_projection import outer_product
from elita_tf.ops.utils.dtypes import NEG_INF, UNSEEN_LOGIT, dtype_of
from elita_tf.ops.utils.positions import leading, pad_axis, shift_right, static_size

# Floor for log(|x|) in the sign-split carry: adds at most 1e-30 to a mean.
_TINY = 1e-30


def logaddexp(a, b):
    """`log(exp(a) + exp(b))`, broadcasting, with the right gradient at ties."""
    a, b = a + ops.zeros_like(b), b + ops.zeros_like(a)
    return ops.logsumexp(ops.stack([a, b], axis=-1), axis=-1)


# How far a logit may rise above its chunk's reference for the factored weights: `exp(span)`, and
# `1 / (1 + C exp(span))`, stay normal numbers (float32's range ends near e^±87, float64's near e^±708).
_SPAN = {"float32": 80.0, "float64": 700.0}


class _Factors(NamedTuple):
    """A chunked sequence's `L = logcumsumexp(l)` and the factors of its chunk weights (`chunk_factors`)."""

    log_z: Any  # [N, K, C]
    rows: Any  # [N, K, C], exp(r - L_i)
    keys: Any  # [N, K, C], exp(l_j - r)
    within: Any  # scalar bool: every row's factors are exact
    exact_rows: Callable  # () -> bool [N, K, C], the rows whose factors are exact
    too_high: Any  # bool [N, K, C], the logits past the span: what `exact_rows` is built from


def _upper(size, dtype):
    """`[C, C]` ones where `j <= i` (row `j`, column `i`), zeros elsewhere."""
    return ops.cast(ops.arange(size, dtype="int32")[:, None] <= ops.arange(size, dtype="int32")[None, :], dtype)


def _exact_rows(too_high, upper):
    """Bool `[N, K, C]`: the rows with no logit past the span at or before them (`too_high [N, K, C]`)."""
    return ops.equal(backend.matmul(ops.cast(too_high, upper.dtype), upper), 0.0)


def chunk_factors(logits):
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
    span = _SPAN[dtype_of(logits)]
    peak = ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True))
    totals = peak[..., 0] + ops.log(ops.sum(ops.exp(logits - peak), axis=-1))  # [N, K]
    before = shift_right(backend.cumulative_logsumexp(totals, axis=1), axis=1, fill=NEG_INF)
    ref = ops.stop_gradient(logaddexp(before, logits[..., 0]))[..., None]  # cancels from L and its gradient
    rise = logits - ref
    # Clamped: a row past a too-high logit takes the exponential forms, but its factors stay finite.
    keys = ops.exp(backend.minimum(rise, span))
    upper = _upper(logits.shape[-1], dtype_of(logits))  # [C, C], j <= i
    z = ops.exp(before[..., None] - ref) + backend.matmul(keys, upper)  # [N, K, C], >= 1

    too_high = rise > span  # a bool, not `rise`, is what the rows' check keeps until the backward pass

    def exact_rows():  # built where it is needed: on a CPU without XLA, only in the branch that needs it
        return _exact_rows(too_high, upper)

    within = ops.logical_not(ops.any(too_high))
    return _Factors(ref + ops.log(z), ops.reciprocal(z), keys, within, exact_rows, too_high)


def chunk_products(log_w, log_norm, items, block_size, factors=None):
    """`Σ_{j<=i} exp(a_j - L_i) x_j` in each chunk: `[N, K, C]` logits `a` and norms `L`, items `[N, K, C, D]`.

    The `C x C` weights are the largest tensor of the forward pass, so the
    backward pass recomputes them (a subtraction and an exponential) rather
    than keep them: `C x C` values a chunk less memory held until then. Their
    gradient needs no mask either: it is `(dE xᵀ) * weights`, zero wherever
    the weights are.

    With `factors` (`chunk_factors` of `a`, whose `log_z` is `L`), a weight is the product
    `rows_i keys_j`: an outer product and the causal mask, two passes over `[N, K, C, C]`
    instead of a subtraction, a bias and an exponential. Rows whose factors are not exact take
    the exponential form. The factors are arguments of the custom gradient, which gives them
    none (they carry no gradient of their own: `L`'s reaches `log_norm`).
    """
    causal = ops.arange(block_size, dtype="int32")[None, :] <= ops.arange(block_size, dtype="int32")[:, None]  # [C, C]
    dtype = dtype_of(log_w)
    # Added, not selected: a select broadcast to `[N, K, C, C]` is the slowest pass here.
    mask_bias = ops.where(causal, ops.convert_to_tensor(0.0, dtype), ops.convert_to_tensor(UNSEEN_LOGIT, dtype))

    def weights(log_w, log_norm, *factored_args):
        def exponential():
            return ops.exp(log_w[:, :, None, :] - log_norm[..., None] + mask_bias)

        if not factored_args:
            return exponential()
        rows, keys, within, too_high = factored_args

        def factored():
            # tril keeps the lower triangle in one pass (TensorFlow's band_part): 1.8 against 3.0 ms for
            # multiplying by the mask at T = 16K on a CPU. The factors are finite and >= 0: the same values.
            return ops.tril(outer_product(rows, keys))

        return backend.branch_or_select(
            within,
            factored,
            lambda: ops.where(_exact_rows(too_high, _upper(block_size, dtype))[..., None], factored(), exponential()),
        )

    def products(log_w, log_norm, items, *factored_args):
        def grad(upstream):
            with keras.name_scope("causal_mean_gradient"):
                # Ordered after the upstream gradient, else every block recomputes its weights at once, early.
                w = backend.ordered([upstream], lambda: weights(log_w, log_norm, *factored_args))
                d_scores = backend.matmul(upstream, items, transpose_b=True) * w  # [N, K, C, C]
                d_items = backend.matmul(w, upstream, transpose_a=True)
                return (ops.sum(d_scores, -2), -ops.sum(d_scores, -1), d_items) + (None,) * len(factored_args)

        return backend.matmul(weights(log_w, log_norm, *factored_args), items), grad

    factored_args = () if factors is None else (factors.rows, factors.keys, factors.within, factors.too_high)
    return backend.custom_gradient(products)(log_w, log_norm, items, *factored_args)


def decayed_prefix(log_norm, items, block_size, levels, item_logits=None, factors=None):
    """`E_k = Σ_{j<=k} exp(a_j - log_norm_k) items_j` for nondecreasing `log_norm`.

    `log_norm [N, K]`, `items [N, K, D]`; `a = item_logits [N, K]`, by
    default `log_norm`. Each `a_j <= log_norm_k` for `j <= k`, so every weight
    is `<= 1`. Blocks of `block_size` are combined with matrix products; the
    carry between blocks is the same sum one level up (the blocks' last rows,
    whose weights are their own `log_norm`). A sequence known at tracing to
    fit in one block is one product; the top level of a longer or unknown
    one is a sign-split `cumulative_logsumexp`, cheap on so few entries.
    `factors` (`chunk_factors`) are this level's, already in blocks.
    """
    log_w = log_norm if item_logits is None else item_logits
    length, depth = static_size(items, 1), static_size(items, 2)
    if isinstance(length, int) and length <= block_size:
        return chunk_products(log_w[:, None], log_norm[:, None], items[:, None], length, factors)[:, 0]
    if levels == 0:
        log_pos = backend.cumulative_logsumexp(log_w[..., None] + ops.log(backend.maximum(items, _TINY)), axis=1)
        log_neg = backend.cumulative_logsumexp(log_w[..., None] + ops.log(backend.maximum(-items, _TINY)), axis=1)
        return ops.exp(log_pos - log_norm[..., None]) - ops.exp(log_neg - log_norm[..., None])
    pad = (-length) % block_size
    if not (isinstance(pad, int) and pad == 0):
        # Padding repeats the last log_norm (length >= 1 here): weights stay <= 1.
        log_norm = ops.take(log_norm, backend.minimum(ops.arange(length + pad, dtype="int32"), length - 1), axis=1)
    lz = ops.reshape(log_norm, [-1, (length + pad) // block_size, block_size])  # [N, K, C]
    x = ops.reshape(pad_axis(items, 1, pad), [-1, (length + pad) // block_size, block_size, depth])  # [N, K, C, D]
    # Padded items are zero and get no weight.
    log_w = ops.reshape(pad_axis(log_w, 1, pad, NEG_INF), [-1, (length + pad) // block_size, block_size])

    inner = chunk_products(log_w, lz, x, block_size, factors)  # [N, K, C, D]
    # Carry: everything before each block, decayed to the block's rows. The blocks' last rows are copied: where a
    # slice is a view (PyTorch), the level above would keep the whole of `inner` for its backward pass.
    carry = decayed_prefix(lz[..., -1], ops.copy(inner[:, :, -1]), block_size, levels - 1)
    prev_lz = shift_right(lz[..., -1], axis=1, fill=NEG_INF)
    prev = shift_right(carry, axis=1)
    # An outer product per chunk (`outer_product`): its gradients are matrix-vector products rather
    # than `[N, K, C, D]` products to be summed.
    out = inner + outer_product(ops.exp(prev_lz[..., None] - lz), prev)
    return leading(ops.reshape(out, [-1, length + pad, depth]), length)
