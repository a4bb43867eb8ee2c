"""Causal softmax attention with a fixed-size key/value cache, for the quadratic baselines.

    row 0: x . . .
    row 1: x x . .      every earlier position (and itself), softmax weights
    row 2: x x x .

The cache is `{"key": [B, L, H, D], "value": [B, L, H, D], "valid": [B, L] bool, "position": [B]}`:
`L` positions allocated once, `valid` False where nothing (or padding) was
written, `position` each row's next position. Shapes never grow, so a
decoding loop compiles once.
"""

import numpy as np
from keras import ops

from elita_tf import backend
from elita_tf.ops.utils.dtypes import accumulator_dtype, dtype_of
from elita_tf.ops.utils.nonfinite import nan_rows
from elita_tf.ops.utils.positions import real_extent, write_positions

KV_CACHE_NAMES = ("key", "value", "valid", "position")


def empty_kv_cache(batch_size, max_sequence_length, num_heads, head_dim, dtype="float32"):
    """`(key, value, valid, position)` before any position: the cache's tensors, in `KV_CACHE_NAMES` order."""
    shape = (batch_size, max_sequence_length, num_heads, head_dim)
    valid = ops.zeros((batch_size, max_sequence_length), "bool")
    return ops.zeros(shape, dtype), ops.zeros(shape, dtype), valid, ops.zeros((batch_size,), "int32")


def update_kv_cache(cache, key, value, mask=None, name="layer", padded_steps_count=False):
    """Writes `T` new positions into each row, at that row's position.

    Args:
        cache: `{"key", "value", "valid", "position"}` (`KV_CACHE_NAMES`).
        key, value: `[B, T, H, D]`.
        mask: optional bool `[B, T]`, False at padding. Each row's position
            moves past its last real position: what follows overwrites right
            padding.
        name: the owning layer's name, for the overflow error.
        padded_steps_count: bool. A padded single step (`T = 1`, mask
            False) keeps its place, as in the parallel form, rather than being
            written over; a prefill's right padding still ends its row. A
            window counts positions so, as the windowed means do (a masked
            step pushes an empty slot). Defaults to `False`.

    Returns:
        `(new_cache, visible)`: `visible [B, 1, T, L]` bool, True where new
        row `t` may attend cache slot `s` (written, not padding, `s <= position + t`).
    """
    key_cache, value_cache, valid, position = (cache[name] for name in KV_CACHE_NAMES)
    batch, length, max_sequence_length = ops.shape(key)[0], ops.shape(key)[1], ops.shape(key_cache)[1]
    backend.check_less_equal(
        ops.max(position) + length,
        max_sequence_length,
        f"The decoding cache of '{name}' is full: it holds max_sequence_length positions",
    )

    new_valid = ops.ones((batch, length), "bool") if mask is None else ops.cast(mask, "bool")
    if mask is not None:  # padding is stored as zeros, whatever it held: no 0 * NaN in the weighted sum
        key = ops.where(new_valid[:, :, None, None], key, 0.0)
        value = ops.where(new_valid[:, :, None, None], value, 0.0)
    key_cache, value_cache, valid = (
        write_positions(buffer, new, position, axis=1)
        for buffer, new in ((key_cache, key), (value_cache, value), (valid, new_valid))
    )
    # Where that check cannot run (`jax.jit`, XLA), a row written past the buffer's end attends NaN values
    # from then on, never the positions it kept.
    value_cache = nan_rows(position + length > max_sequence_length, value_cache)
    query_position = position[:, None, None] + ops.arange(length, dtype="int32")[None, :, None]  # [B, T, 1]
    visible = ops.logical_and(
        (ops.arange(max_sequence_length, dtype="int32")[None, None, :] <= query_position)[:, None],
        valid[:, None, None, :],
    )
    # Right padding is not part of the sequence: the next positions overwrite it.
    advance = real_extent(mask, length)
    if padded_steps_count:
        advance = ops.where(ops.equal(length, 1), 1, advance)
    new_cache = (key_cache, value_cache, valid, position + advance)
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
    causal = ops.arange(length, dtype="int32")[None, :] <= ops.arange(length, dtype="int32")[:, None]
    visible = causal[None, None]
    if mask is not None:
        visible = ops.logical_and(visible, ops.cast(mask, "bool")[:, None, None, :])
    if document_starts is not None:
        visible = ops.logical_and(visible, same_document(document_starts)[:, None])
    return visible


def same_document(document_starts):
    """`[B, T, T]` bool: True where query `t` and key `s` are in one document (`document_starts [B, T]` starts them)."""
    document = ops.cumsum(ops.cast(document_starts, "int32"), axis=1)
    return ops.equal(document[:, :, None], document[:, None, :])


def softmax_attention(query, key, value, visible):
    """`softmax(q kᵀ / sqrt(D))` over visible keys, then the values; float32 inside (float64 stays).

    Args:
        query: `[B, T, H, D]`. key, value: `[B, S, H, D]`. visible: `[B or 1, 1, T, S]` bool.

    Returns:
        `[B, T, H, D]` in the accumulator dtype. A row with no visible key gets zeros.
    """
    acc = accumulator_dtype(dtype_of(query))
    scale = ops.cast(ops.shape(query)[-1], acc) ** -0.5
    scores = ops.einsum("bthd,bshd->bhts", ops.cast(query, acc), ops.cast(key, acc)) * scale
    # A tensor of `acc`: on PyTorch a Python float becomes float32, whose -inf makes a float64 row with no key NaN.
    scores = ops.where(visible, scores, ops.convert_to_tensor(np.finfo(acc).min, acc))
    if scores.shape[-1] == 1:  # one key: the softmax is 1 (NaN for a non-finite score), of which Keras warns
        weights = ops.exp(scores - scores) * ops.cast(visible, acc)
    else:
        weights = ops.softmax(scores, axis=-1) * ops.cast(visible, acc)
    return ops.einsum("bhts,bshd->bthd", weights, ops.cast(value, acc))
