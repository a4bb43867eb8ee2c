"""Positions along time: padding, shifting and cutting an axis, writing into a fixed-size buffer, where each row's real
positions end."""

import tensorflow as tf


def pad_axis(x, axis, pad, value=0):
    """`x` with `pad` entries of `value` appended along `axis`; `x` itself, no op, when `pad` is a Python 0."""
    if isinstance(pad, int) and pad == 0:
        return x
    paddings = [[0, 0]] * x.shape.rank
    paddings[axis] = [0, pad]
    return tf.pad(x, paddings, constant_values=value)


def write_positions(buffer, new, index, axis):
    """`buffer` with positions `index .. index + T` along `axis` replaced by `new` (`T` along `axis`).

    `index` is a scalar, or int `[B]` with a position per row (batch axis 0,
    `axis >= 1`). A gather and a select rather than a concatenation of
    slices, so every shape stays static and XLA compiles a decoding loop
    around it.
    """
    new = tf.cast(new, buffer.dtype)
    index = tf.convert_to_tensor(index, tf.int32)
    length = tf.shape(new)[axis]
    new = pad_axis(new, axis, 1)  # one spare entry, so that T = 0 gathers from a non-empty tensor
    slots = tf.range(tf.shape(buffer)[axis])
    shape = [1] * buffer.shape.rank
    if index.shape.rank == 0:
        slot = slots - index
        gathered = tf.gather(new, tf.clip_by_value(slot, 0, length), axis=axis)
        shape[axis] = -1
    else:
        slot = slots[None, :] - index[:, None]  # [B, L]
        gathered = tf.gather(new, tf.clip_by_value(slot, 0, length), axis=axis, batch_dims=1)
        shape[0], shape[axis] = -1, tf.shape(buffer)[axis]
    written = (slot >= 0) & (slot < length)
    return tf.where(tf.reshape(written, shape), gathered, buffer)


def real_extent(mask, length):
    """Per row, the position after its last real (unpadded) one, int32 `[B]`; the scalar `length` without a mask.

    A decoding state advances by this much: padding after a row's last real
    position (right padding) is not part of the sequence, so what follows
    overwrites it; padding before (left padding) or between real positions
    keeps its place.
    """
    if mask is None:
        return tf.convert_to_tensor(length, tf.int32)
    positions = tf.range(1, tf.shape(mask)[1] + 1)[None, :]
    # At least 0: the maximum over no positions (T = 0) is the smallest int32.
    return tf.maximum(tf.reduce_max(tf.where(tf.cast(mask, tf.bool), positions, 0), axis=1), 0)


def window_after(sequence, end, size, axis):
    """Entries `end .. end + size` along `axis` of each row of `sequence` (batch axis 0).

    `sequence` is a ring buffer of `size` earlier positions followed by the new
    ones; with the new positions ending at `end` (`real_extent`, `[B]` or a
    scalar), these are the `size` most recent: right padding never enters the ring.
    """
    end = tf.broadcast_to(tf.convert_to_tensor(end, tf.int32), tf.shape(sequence)[:1])
    index = end[:, None] + tf.range(size)[None, :]  # [B, size]
    return tf.gather(sequence, index, axis=axis, batch_dims=1)


def static_size(x, axis):
    """`x`'s size along `axis`: a Python int when the shape is known at tracing, else a tensor."""
    return x.shape[axis] if x.shape[axis] is not None else tf.shape(x)[axis]


def leading(x, length):
    """`x[:, :length]`, or `x` itself when that is all of it at tracing: no slice, whose gradient is a full copy."""
    if isinstance(length, int) and x.shape[1] == length:
        return x
    return x[:, :length]


def shift_right(x, axis, fill=0.0, steps=1):
    """`x` moved `steps` along `axis`, `fill` entering at the start (safe for any size).

    A pad and a slice: their gradients are a slice and a pad, not a scatter.
    """
    pad = [[0, 0]] * x.shape.rank
    pad[axis] = [steps, 0]
    padded = tf.pad(x, pad, constant_values=fill)
    return tf.slice(padded, tf.zeros_like(tf.shape(x)), tf.shape(x))
