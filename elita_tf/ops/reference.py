"""Naive O(T^2) references, for tests only.

Each builds the full `[T, T]` matrix of the definition and takes a
max-subtracted softmax over it, in the dtype it is given (tests use float64).
They are slow and obviously right; the fast forms are checked against them,
outputs and gradients.
"""

import math

import tensorflow as tf


def window_mask(length, window=None):
    """`[T, T]` bool, True where row `i` sees column `j`."""
    i = tf.range(length)[:, None]
    j = tf.range(length)[None, :]
    visible = j <= i
    if window is not None:
        visible &= j > i - window
    return visible


def causal_softmax_mean_reference(logits, values, window=None, mask=None):
    """`(mean [B, H, T, D], log_z [B, H, T])` of docs/math.md §1 by its definition."""
    length = tf.shape(logits)[-1]
    visible = window_mask(length, window)[None, None]  # [1, 1, T, T]
    if mask is not None:
        visible &= tf.cast(mask, tf.bool)[:, None, None, :]
    scores = tf.where(visible, logits[:, :, None, :], logits.dtype.min)
    log_z = tf.reduce_logsumexp(scores, axis=-1)
    weights = tf.exp(scores - log_z[..., None])
    return tf.einsum("bhij,bhjd->bhid", weights, values), log_z


def attention2_reference(kappa, delta, rho, values, logit_clip=None):
    """ELiTA `Attention2` per-head output `y [B, H, T, D]` by its definition (docs/math.md §2).

    Row `i` is a softmax over `i + 2` slots: the self slot (logit `δ_i`,
    value `v_i`) and the slots `j <= i` (logit `ρ_i + κ_j`, value `v_j`).
    With `logit_clip` it is the original code instead: clipped exponentials,
    plain cumulative sums and a division.
    """
    if logit_clip is not None:
        e_k = tf.exp(tf.clip_by_value(kappa, -logit_clip, logit_clip))
        e_d = tf.exp(tf.clip_by_value(delta, -logit_clip, logit_clip))
        e_r = tf.exp(tf.clip_by_value(rho, -logit_clip, logit_clip))
        num = e_d[..., None] * values + e_r[..., None] * tf.cumsum(e_k[..., None] * values, axis=2)
        den = e_d + e_r * tf.cumsum(e_k, axis=2)
        return num / den[..., None]
    length = tf.shape(kappa)[-1]
    visible = window_mask(length)[None, None]
    cross = tf.where(visible, rho[..., :, None] + kappa[..., None, :], kappa.dtype.min)
    scores = tf.concat([delta[..., None], cross], axis=-1)  # [B, H, T, 1 + T]
    weights = tf.nn.softmax(scores, axis=-1)
    return weights[..., :1] * values + tf.einsum("bhij,bhjd->bhid", weights[..., 1:], values)


def causal_linear_attention_reference(query_features, key_features, values, mask=None, epsilon=1e-6):
    """Causal linear attention (docs/math.md §5) by its definition: `[T, T]` weights `φ(q_i)·φ(k_j)` for `j <= i`."""
    length = tf.shape(query_features)[2]
    visible = window_mask(length)[None, None]
    if mask is not None:
        visible &= tf.cast(mask, tf.bool)[:, None, None, :]
    weights = tf.where(visible, tf.einsum("bhik,bhjk->bhij", query_features, key_features), 0.0)
    weights = tf.cast(weights, values.dtype)
    return tf.einsum("bhij,bhjv->bhiv", weights, values) / (tf.reduce_sum(weights, -1, keepdims=True) + epsilon)


def cross_entropy_reference(hidden, kernel, labels, bias=None, scale=1.0):
    """Softmax cross-entropy (docs/math.md §10) from the full `[..., V]` logits, `logsumexp(z) - z[label]`."""
    logits = tf.matmul(hidden, kernel) * scale if bias is None else (tf.matmul(hidden, kernel) + bias) * scale
    label_logit = tf.gather(logits, labels, axis=-1, batch_dims=labels.shape.rank)
    return tf.reduce_logsumexp(logits, axis=-1) - label_logit


def banded_attention_reference(
    queries, keys, values, window=None, slope=0.0, hyper=0.0, scale=None, mask=None, document_starts=None
):
    """`out [B, H, T, Dv]` of `banded_attention` by its definition, for tests only.

    Builds the `[T, 1 + T]` logits of every row (the null slot first) and
    takes a softmax over them, in the dtype it is given (tests use float64).
    With `document_starts`, row `i` sees only its document, whose first position is its start.
    """
    length = tf.shape(queries)[2]
    dtype = queries.dtype
    if scale is None:
        scale = 1.0 / math.sqrt(queries.shape[-1])
    i = tf.range(length)[None, :, None]
    j = tf.range(length)[None, None, :]
    if document_starts is None:
        start, same = tf.zeros_like(i), tf.ones([1, 1, 1], tf.bool)
    else:
        document = tf.cumsum(tf.cast(document_starts, tf.int32), axis=1)
        same = tf.equal(document[:, :, None], document[:, None, :])
        start = tf.reduce_min(tf.where(same, j, length), axis=-1, keepdims=True)  # [B, T, 1]
    span = (j < i) & same
    if window is not None:
        span &= (j > i - window) | (j == start)
    span = span[:, None]
    if mask is not None:
        span &= tf.cast(mask, tf.bool)[:, None, None, :]
    distance = tf.cast(tf.maximum(i - j, 1), dtype)
    logits = scale * tf.einsum("bhiq,bhjq->bhij", queries, keys) - slope * distance + hyper / distance
    logits = tf.where(span, logits, dtype.min)
    null = tf.zeros_like(logits[..., :1])
    weights = tf.nn.softmax(tf.concat([null, logits], axis=-1), axis=-1)[..., 1:]
    return tf.einsum("bhij,bhjd->bhid", weights, values)
