"""Packed documents: positions that restart at each document, and scans that a document start clears."""

import tensorflow as tf

from elita_tf.ops.utils.positions import pad_axis, shift_right


def document_index(document_starts, length_multiple=1):
    """Per position, how many document_starts come at or before it: int32 `[B, T']`, `T'` padded to `length_multiple`.

    `document_starts` is bool `[B, T]`, True where a new document starts (nothing
    before it is seen from there on). Padding continues the last segment.
    """
    document_starts = tf.cast(document_starts, tf.int32)
    return tf.cumsum(pad_axis(document_starts, 1, (-tf.shape(document_starts)[1]) % length_multiple), axis=1)


def gated_scan(gates, items, combine, axis):
    """Inclusive scan along `axis` that restarts wherever `gates` is False.

    `out_k = combine(out_{k-1}, items_k)` where `gates_k`, else `items_k`:
    a running state that a document boundary clears. `items` is a tuple of
    tensors, `gates` a bool tensor of their shape up to `axis`. Hillis-Steele
    doubling: `ceil(log2 K)` rounds of one shift and one `combine` each, with
    no subtraction (exact for sums, stable for log-sum-exp merges), and
    every round differentiable.

    Args:
        gates: bool `[..., K]`, `axis = gates.shape.rank - 1`.
        items: tuple of tensors `[..., K, ...]`.
        combine: `(earlier, later) -> merged`, on tuples like `items`; associative.
        axis: int, the scanned axis.
    """
    items = tuple(items)
    size = tf.shape(gates)[axis]

    def expand(mask, x):
        return tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([x.shape.rank - mask.shape.rank], tf.int32)], 0))

    def body(steps, gates, *items):
        # Entry k holds the span (k - steps, k]; it takes the span before it unless a barrier is in its own.
        merged = combine(tuple(shift_right(x, axis, 0, steps) for x in items), items)
        take = gates & (tf.range(size) >= steps)
        items = tuple(tf.where(expand(take, x), m, x) for m, x in zip(merged, items))
        # The first `steps` entries are complete prefixes: whatever their gate, nothing lies before them.
        return (steps * 2, gates & shift_right(gates, axis, False, steps), *items)

    static_size = gates.shape[axis]
    if static_size is None:
        _, _, *items = tf.while_loop(lambda steps, *_: steps < size, body, (tf.constant(1), gates, *items))
        return tuple(items)
    # A known length unrolls its rounds: shifts by constants, which XLA needs (its pads take static sizes).
    steps = 1
    while steps < static_size:
        _, gates, *items = body(steps, gates, *items)
        steps *= 2
    return tuple(items)


def document_positions(length, start=None, document_starts=None):
    """Each position's index in its sequence, int32 `[B or 1, T]`: `start + t`, restarting at 0 at every reset.

    Args:
        length: scalar `T`.
        start: optional int `[B]`, the index of the first position (a continued sequence).
        document_starts: optional bool `[B, T]`, True where a new document starts.
    """
    index = tf.range(length)[None, :]
    if start is not None:
        index = index + start[:, None]
    if document_starts is not None:
        ones = tf.ones_like(document_starts, tf.int32)
        (count,) = gated_scan(tf.logical_not(document_starts), (ones,), lambda a, b: (a[0] + b[0],), axis=1)
        index = tf.where(tf.cumsum(tf.cast(document_starts, tf.int32), axis=1) > 0, count - 1, index)
    return index


def position_after(index, start, end):
    """The index after each row's last real position: `index [B, T]` at `end - 1`, plus 1 (`start` where `end = 0`)."""
    end = tf.broadcast_to(end, tf.shape(start))
    last = tf.gather(pad_axis(index, 1, 1), tf.maximum(end - 1, 0), batch_dims=1)
    return tf.where(end > 0, last + 1, start)
