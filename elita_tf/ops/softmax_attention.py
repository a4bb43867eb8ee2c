"""Causal softmax attention with a fixed-size key/value cache, for the quadratic baselines.

    row 0: x . . .
    row 1: x x . .      every earlier position (and itself), softmax weights
    row 2: x x x .

The cache is `(key [B, L, H, D], value [B, L, H, D], valid [B, L] bool, index [])`:
`L` positions allocated once, `valid` False where nothing (or padding) was
written, `index` the next position. Shapes never grow, so a decoding loop
compiles once.
"""

import tensorflow as tf

from elita_tf.ops.causal_mean import accumulator_dtype
from elita_tf.ops.utils import real_extent, write_positions


def empty_kv_cache(batch_size, max_length, num_heads, head_dim, dtype=tf.float32):
    shape = [batch_size, max_length, num_heads, head_dim]
    valid = tf.zeros([batch_size, max_length], tf.bool)
    return tf.zeros(shape, dtype), tf.zeros(shape, dtype), valid, tf.constant(0, tf.int32)


def update_kv_cache(cache, key, value, mask=None, name="layer"):
    """Writes `T` new positions at `index`.

    Args:
        cache: `(key, value, valid, index)`.
        key, value: `[B, T, H, D]`.
        mask: optional bool `[B, T]`, False at padding. The index moves
            past the last real position (the latest of any row): later
            positions overwrite right padding.
        name: the owning layer's name, for the overflow error.

    Returns:
        `(new_cache, visible)`: `visible [B, 1, T, L]` bool, True where new
        row `t` may attend cache slot `s` (written, not padding, `s <= index + t`).
    """
    key_cache, value_cache, valid, index = cache
    batch, length, max_length = tf.shape(key)[0], tf.shape(key)[1], tf.shape(key_cache)[1]
    tf.debugging.assert_less_equal(
        index + length,
        max_length,
        message=f"The decoding cache of '{name}' is full: it holds max_length positions",
    )

    new_valid = tf.ones([batch, length], tf.bool) if mask is None else tf.cast(mask, tf.bool)
    if mask is not None:  # padding is stored as zeros, whatever it held: no 0 * NaN in the weighted sum
        key = tf.where(new_valid[:, :, None, None], key, tf.zeros([], key.dtype))
        value = tf.where(new_valid[:, :, None, None], value, tf.zeros([], value.dtype))
    key_cache, value_cache, valid = (
        write_positions(buffer, new, index, axis=1)
        for buffer, new in ((key_cache, key), (value_cache, value), (valid, new_valid))
    )
    causal = tf.range(max_length)[None, :] <= index + tf.range(length)[:, None]  # [T, L]
    visible = causal[None, None] & valid[:, None, None, :]
    # Right padding is not part of the sequence: the next positions overwrite it.
    advance = tf.reduce_max(real_extent(mask, length))
    return (key_cache, value_cache, valid, index + advance), visible


def causal_visibility(length, mask=None):
    """`[B or 1, 1, T, T]` bool: causal, and no padded key."""
    causal = tf.range(length)[None, :] <= tf.range(length)[:, None]
    visible = causal[None, None]
    if mask is not None:
        visible = visible & tf.cast(mask, tf.bool)[:, None, None, :]
    return visible


def softmax_attention(query, key, value, visible):
    """`softmax(q kᵀ / sqrt(D))` over visible keys, then the values; float32 inside (float64 stays).

    Args:
        query: `[B, T, H, D]`. key, value: `[B, S, H, D]`. visible: `[B or 1, 1, T, S]` bool.

    Returns:
        `[B, T, H, D]` in the accumulator dtype. A row with no visible key gets zeros.
    """
    acc = accumulator_dtype(query.dtype)
    scale = tf.cast(tf.shape(query)[-1], acc) ** -0.5
    scores = tf.einsum("bthd,bshd->bhts", tf.cast(query, acc), tf.cast(key, acc)) * scale
    scores = tf.where(visible, scores, acc.min)
    weights = tf.nn.softmax(scores, axis=-1) * tf.cast(visible, acc)
    return tf.einsum("bhts,bshd->bthd", weights, tf.cast(value, acc))
