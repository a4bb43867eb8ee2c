"""Positions along time: padding, shifting and cutting an axis, writing into a fixed-size buffer, where each row's real
positions end."""

from keras import ops

from elita_tf import backend


def pad_axis(x, axis, pad, value=0):
    """`x` with `pad` entries of `value` appended along `axis`; `x` itself, no op, when `pad` is a Python 0."""
    if isinstance(pad, int) and pad == 0:
        return x
    paddings = [[0, 0]] * len(x.shape)
    paddings[axis] = [0, pad]
    return ops.pad(x, paddings, constant_values=value)


def gather_rows(x, index, axis):
    """`x` at `index [B, K]` along `axis` (>= 1), each batch row (axis 0) with its own indices: `[B, ..., K, ...]`."""
    shape = [1] * len(x.shape)
    shape[0], shape[axis] = -1, index.shape[1] if index.shape[1] is not None else ops.shape(index)[1]
    return ops.take_along_axis(x, ops.reshape(index, shape), axis=axis)


def write_positions(buffer, new, index, axis):
    """`buffer` with positions `index .. index + T` along `axis` replaced by `new` (`T` along `axis`).

    `index` is a scalar, or int `[B]` with a position per row (batch axis 0,
    `axis >= 1`). A gather and a select rather than a concatenation of
    slices, so every shape stays static and XLA compiles a decoding loop
    around it.
    """
    new = ops.cast(new, buffer.dtype)
    index = ops.cast(index, "int32")
    length = ops.shape(new)[axis]
    new = pad_axis(new, axis, 1)  # one spare entry, so that T = 0 gathers from a non-empty tensor
    slots = ops.arange(ops.shape(buffer)[axis], dtype="int32")
    rank = len(buffer.shape)
    shape = [1] * rank
    if len(index.shape) == 0:
        slot = slots - index
        gathered = ops.take(new, ops.clip(slot, 0, length), axis=axis)
        shape[axis] = -1
    else:
        slot = slots[None, :] - index[:, None]  # [B, L]
        gathered = gather_rows(new, ops.clip(slot, 0, length), axis)
        shape[0], shape[axis] = -1, ops.shape(buffer)[axis]
    written = ops.logical_and(slot >= 0, slot < length)
    return ops.where(ops.reshape(written, shape), gathered, buffer)


def real_extent(mask, length):
    """Per row, the position after its last real (unpadded) one, int32 `[B]`; the scalar `length` without a mask.

    A decoding state advances by this much: padding after a row's last real
    position (right padding) is not part of the sequence, so what follows
    overwrites it; padding before (left padding) or between real positions
    keeps its place.
    """
    if mask is None:
        return ops.convert_to_tensor(length, "int32")
    positions = ops.arange(1, ops.shape(mask)[1] + 1, dtype="int32")[None, :]
    return max_at_least(ops.where(ops.cast(mask, "bool"), positions, 0), 0, axis=1)


def max_at_least(x, floor, axis):
    """The maximum of `x` along `axis`, and at least `floor`: `floor` where the axis is empty.

    Keras' `ops.max(..., initial=floor)` without its `initial`, which on PyTorch fills a tensor from a tensor,
    a host read that the `"meta"` device of Keras' shape inference refuses (and then runs the model on real
    tensors instead). A tensor of no entries (any axis of size 0: Keras' PyTorch `max` refuses every one) has
    none to take; one of an unknown size (a TensorFlow graph) takes TensorFlow's, whose maximum over no entries
    is the dtype's lowest.
    """
    if 0 in x.shape:
        shape = [size for i, size in enumerate(ops.shape(x)) if i != axis % len(x.shape)]
        return backend.full(shape, floor, x.dtype)
    return ops.maximum(ops.max(x, axis=axis), floor)


def window_after(sequence, end, size, axis):
    """Entries `end .. end + size` along `axis` of each row of `sequence` (batch axis 0).

    `sequence` is a ring buffer of `size` earlier positions followed by the new
    ones; with the new positions ending at `end` (`real_extent`, `[B]` or a
    scalar), these are the `size` most recent: right padding never enters the ring.
    """
    end = ops.broadcast_to(ops.cast(end, "int32"), ops.shape(sequence)[:1])
    index = end[:, None] + ops.arange(size, dtype="int32")[None, :]  # [B, size]
    return gather_rows(sequence, index, axis)


def static_size(x, axis):
    """`x`'s size along `axis`: a Python int when the shape is known at tracing, else a tensor."""
    return ops.shape(x)[axis]


def leading(x, length):
    """`x[:, :length]`, or `x` itself when that is all of it at tracing: no slice, whose gradient is a full copy."""
    if isinstance(length, int) and x.shape[1] == length:
        return x
    return x[:, :length]


def shift_right(x, axis, fill=0.0, steps=1):
    """`x` moved `steps` along `axis`, `fill` entering at the start (safe for any size).

    A pad and a slice: their gradients are a slice and a pad, not a scatter.
    """
    pad = [[0, 0]] * len(x.shape)
    pad[axis] = [steps, 0]
    padded = ops.pad(x, pad, constant_values=fill)
    return ops.slice(padded, [0] * len(x.shape), ops.shape(x))
