"""Naive O(T^2) references, for tests only.

Each builds the full `[T, T]` matrix of the definition and takes a
max-subtracted softmax over it, in the dtype it is given (tests use float64,
on every backend). They are written in `keras.ops`, so that each backend also
differentiates them: they are slow and obviously right, and the fast forms
are checked against them, outputs and gradients.
"""

import math

from keras import ops

from elita_tf import backend
from elita_tf.ops.utils.dtypes import dtype_of

# Stands in for -inf in a reference's masked logits: exp() of it, minus any row maximum, is exactly 0.
_MASKED = -1e300


def _masked_logit(dtype):
    if dtype in ("float32", "float16", "bfloat16"):
        return -3e38
    # A tensor, not a Python float: Keras' torch and JAX backends convert a Python float to float32 (-inf here).
    return ops.convert_to_tensor(_MASKED, dtype)


def window_mask(length, window=None):
    """`[T, T]` bool, True where row `i` sees column `j`."""
    i = ops.arange(length, dtype="int32")[:, None]
    j = ops.arange(length, dtype="int32")[None, :]
    visible = j <= i
    if window is not None:
        visible = ops.logical_and(visible, j > i - window)
    return visible


def causal_softmax_mean_reference(logits, values, window=None, mask=None):
    """`(mean [B, H, T, D], log_z [B, H, T])`: each row's softmax-weighted mean of the values it sees, by definition."""
    length = ops.shape(logits)[-1]
    visible = window_mask(length, window)[None, None]  # [1, 1, T, T]
    if mask is not None:
        visible = ops.logical_and(visible, ops.cast(mask, "bool")[:, None, None, :])
    scores = ops.where(visible, logits[:, :, None, :], _masked_logit(dtype_of(logits)))
    log_z = ops.logsumexp(scores, axis=-1)
    weights = ops.exp(scores - log_z[..., None])
    return ops.einsum("bhij,bhjd->bhid", weights, values), log_z


def attention2_reference(kappa, delta, rho, values, logit_clip=None):
    """ELiTA `Attention2` per-head output `y [B, H, T, D]` by its definition.

    Row `i` is a softmax over `i + 2` slots: the self slot (logit `δ_i`,
    value `v_i`) and the slots `j <= i` (logit `ρ_i + κ_j`, value `v_j`).
    With `logit_clip` it is the original code instead: clipped exponentials,
    plain cumulative sums and a division.
    """
    if logit_clip is not None:
        e_k, e_d, e_r = (ops.exp(ops.clip(z, -logit_clip, logit_clip)) for z in (kappa, delta, rho))
        num = e_d[..., None] * values + e_r[..., None] * ops.cumsum(e_k[..., None] * values, axis=2)
        den = e_d + e_r * ops.cumsum(e_k, axis=2)
        return num / den[..., None]
    length = ops.shape(kappa)[-1]
    visible = window_mask(length)[None, None]
    cross = ops.where(visible, rho[..., :, None] + kappa[..., None, :], _masked_logit(dtype_of(kappa)))
    scores = ops.concatenate([delta[..., None], cross], axis=-1)  # [B, H, T, 1 + T]
    weights = ops.softmax(scores, axis=-1)
    return weights[..., :1] * values + ops.einsum("bhij,bhjd->bhid", weights[..., 1:], values)


def causal_linear_attention_reference(query_features, key_features, values, mask=None, epsilon=1e-6):
    """Causal linear attention by its definition: `[T, T]` weights `φ(q_i)·φ(k_j)` for `j <= i`."""
    length = ops.shape(query_features)[2]
    visible = window_mask(length)[None, None]
    if mask is not None:
        visible = ops.logical_and(visible, ops.cast(mask, "bool")[:, None, None, :])
    weights = ops.where(visible, ops.einsum("bhik,bhjk->bhij", query_features, key_features), 0.0)
    weights = ops.cast(weights, values.dtype)
    return ops.einsum("bhij,bhjv->bhiv", weights, values) / (ops.sum(weights, -1, keepdims=True) + epsilon)


def cross_entropy_reference(hidden, kernel, labels, bias=None, scale=1.0):
    """Softmax cross-entropy from the full `[..., V]` logits, `logsumexp(z) - z[label]`."""
    logits = backend.matmul(hidden, kernel)  # in float64 on every backend
    logits = (logits if bias is None else logits + bias) * scale
    label_logit = ops.take_along_axis(logits, ops.cast(labels, "int32")[..., None], axis=-1)[..., 0]
    return ops.logsumexp(logits, axis=-1) - label_logit


def banded_attention_reference(
    queries, keys, values, window=None, slope=0.0, hyper=0.0, scale=None, mask=None, document_starts=None
):
    """`out [B, H, T, Dv]` of `banded_attention` by its definition, for tests only.

    Builds the `[T, 1 + T]` logits of every row (the null slot first) and
    takes a softmax over them, in the dtype it is given (tests use float64).
    With `document_starts`, row `i` sees only its document, whose first position is its start.
    """
    length = ops.shape(queries)[2]
    dtype = dtype_of(queries)
    if scale is None:
        scale = 1.0 / math.sqrt(queries.shape[-1])
    i = ops.arange(length, dtype="int32")[None, :, None]
    j = ops.arange(length, dtype="int32")[None, None, :]
    if document_starts is None:
        start, same = ops.zeros_like(i), ops.ones((1, 1, 1), "bool")
    else:
        document = ops.cumsum(ops.cast(document_starts, "int32"), axis=1)
        same = ops.equal(document[:, :, None], document[:, None, :])
        start = ops.min(ops.where(same, j, length), axis=-1, keepdims=True)  # [B, T, 1]
    span = ops.logical_and(j < i, same)
    if window is not None:
        span = ops.logical_and(span, ops.logical_or(j > i - window, ops.equal(j, start)))
    span = span[:, None]
    if mask is not None:
        span = ops.logical_and(span, ops.cast(mask, "bool")[:, None, None, :])
    distance = ops.cast(ops.maximum(i - j, 1), dtype)
    logits = scale * ops.einsum("bhiq,bhjq->bhij", queries, keys) - slope * distance + hyper / distance
    logits = ops.where(span, logits, _masked_logit(dtype))
    null = ops.zeros_like(logits[..., :1])
    weights = ops.softmax(ops.concatenate([null, logits], axis=-1), axis=-1)[..., 1:]
    return ops.einsum("bhij,bhjd->bhid", weights, values)


def short_convolution_reference(inputs, kernel, bias=None, mask=None, document_starts=None):
    """`short_convolution` by its definition: a `[T, T]` matrix per channel, `w_{K-1-(i-j)}` where row `i` sees
    input `j` (`0 <= i - j < K`, `j` real and of `i`'s document)."""
    length, size = ops.shape(inputs)[1], kernel.shape[0]
    lag = ops.arange(length, dtype="int32")[:, None] - ops.arange(length, dtype="int32")[None, :]  # [T, T], i - j
    seen = ops.logical_and(lag >= 0, lag < size)[None]  # [1, T, T]
    if document_starts is not None:
        document = ops.cumsum(ops.cast(document_starts, "int32"), axis=1)
        seen = ops.logical_and(seen, ops.equal(document[:, :, None], document[:, None, :]))
    if mask is not None:
        seen = ops.logical_and(seen, ops.cast(mask, "bool")[:, None, :])
    weights = ops.take(kernel, ops.clip(size - 1 - lag, 0, size - 1), axis=0)  # [T, T, d]
    weights = ops.where(seen[..., None], weights[None], ops.zeros((), weights.dtype))
    weights = ops.broadcast_to(weights, (ops.shape(inputs)[0], *ops.shape(weights)[1:]))
    outputs = ops.einsum("bijd,bjd->bid", weights, inputs)
    return outputs if bias is None else outputs + bias
