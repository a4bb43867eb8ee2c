"""Causal softmax attention with a fixed-size key/value cache, for the quadratic baselines.

    row 0: x . . .
    row 1: x x . .      every earlier position (and itself), softmax weights
    row 2: x x x .

The cache is `{"key": [B, L, H, D], "value": [B, L, H, D], "valid": [B, L] bool, "position": [B]}`:
`L` positions allocated once, `valid` False where nothing (or padding) was
written, `position` each row's next position. Shapes never grow, so a
decoding loop compiles once.
"""

import tensorflow as tf

from elita_tf.ops.utils.dtypes import accumulator_dtype
from elita_tf.ops.utils.positions import real_extent, write_positions

KV_CACHE_NAMES = ("key", "value", "valid", "position")


def empty_kv_cache(batch_size, max_sequence_length, num_heads, head_dim, dtype=tf.float32):
    """`(key, value, valid, position)` before any position: the cache's tensors, in `KV_CACHE_NAMES` order."""
    shape = [batch_size, max_sequence_length, num_heads, head_dim]
    valid = tf.zeros([batch_size, max_sequence_length], tf.bool)
    return tf.zeros(shape, dtype), tf.zeros(shape, dtype), valid, tf.zeros([batch_size], tf.int32)


def update_kv_cache(cache, key, value, mask=None, name="layer"):
    """Writes `T` new positions into each row, at that row's position.

    Args:
        cache: `{"key", "value", "valid", "position"}` (`KV_CACHE_NAMES`).
        key, value: `[B, T, H, D]`.
        mask: optional bool `[B, T]`, False at padding. Each row's position
            moves past its last real position: what follows overwrites right
            padding.
        name: the owning layer's name, for the overflow error.

    Returns:
        `(new_cache, visible)`: `visible [B, 1, T, L]` bool, True where new
        row `t` may attend cache slot `s` (written, not padding, `s <= position + t`).
    """
    key_cache, value_cache, valid, position = (cache[name] for name in KV_CACHE_NAMES)
    batch, length, max_sequence_length = tf.shape(key)[0], tf.shape(key)[1], tf.shape(key_cache)[1]
    tf.debugging.assert_less_equal(
        tf.reduce_max(position) + length,
        max_sequence_length,
        message=f"The decoding cache of '{name}' is full: it holds max_sequence_length positions",
    )

    new_valid = tf.ones([batch, length], tf.bool) if mask is None else tf.cast(mask, tf.bool)
    if mask is not None:  # padding is stored as zeros, whatever it held: no 0 * NaN in the weighted sum
        key = tf.where(new_valid[:, :, None, None], key, tf.zeros([], key.dtype))
        value = tf.where(new_valid[:, :, None, None], value, tf.zeros([], value.dtype))
    key_cache, value_cache, valid = (
        write_positions(buffer, new, position, axis=1)
        for buffer, new in ((key_cache, key), (value_cache, value), (valid, new_valid))
    )
    query_position = position[:, None, None] + tf.range(length)[None, :, None]  # [B, T, 1]
    visible = (tf.range(max_sequence_length)[None, None, :] <= query_position)[:, None] & valid[:, None, None, :]
    # Right padding is not part of the sequence: the next positions overwrite it.
    new_cache = (key_cache, value_cache, valid, position + real_extent(mask, length))
    return dict(zip(KV_CACHE_NAMES, new_cache)), visible


def causal_visibility(length, mask=None, document_starts=None):
    """`[B or 1, 1, T, T]` bool: causal, no padded key, and (with `document_starts [B, T]`) no key of another document.

    With packed documents the mask is block-diagonal: a document is the run
    of positions from one reset to the next, numbered by the document_starts so far.

        document_starts 1 0 1 0 0   row 0: x . . . .
                           row 1: x x . . .
                           row 2: . . x . .
                           row 3: . . x x .
                           row 4: . . x x x
    """
    causal = tf.range(length)[None, :] <= tf.range(length)[:, None]
    visible = causal[None, None]
    if mask is not None:
        visible = visible & tf.cast(mask, tf.bool)[:, None, None, :]
    if document_starts is not None:
        visible = visible & same_document(document_starts)[:, None]
    return visible


def same_document(document_starts):
    """`[B, T, T]` bool: True where query `t` and key `s` are in one document (`document_starts [B, T]` starts them)."""
    document = tf.cumsum(tf.cast(document_starts, tf.int32), axis=1)
    return tf.equal(document[:, :, None], document[:, None, :])


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
