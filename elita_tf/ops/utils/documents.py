"""Packed documents: positions that restart at each document, and scans that a document start clears."""

from keras import ops

from elita_tf.ops.utils.positions import gather_rows, pad_axis, shift_right


def document_index(document_starts, length_multiple=1):
    """Per position, how many document_starts come at or before it: int32 `[B, T']`, `T'` padded to `length_multiple`.

    `document_starts` is bool `[B, T]`, True where a new document starts (nothing
    before it is seen from there on). Padding continues the last segment.
    """
    document_starts = ops.cast(document_starts, "int32")
    return ops.cumsum(pad_axis(document_starts, 1, (-ops.shape(document_starts)[1]) % length_multiple), axis=1)


def gated_scan(gates, items, combine, axis):
    """Inclusive scan along `axis` that restarts wherever `gates` is False.

    `out_k = combine(out_{k-1}, items_k)` where `gates_k`, else `items_k`:
    a running state that a document boundary clears. `items` is a tuple of
    tensors, `gates` a bool tensor of their shape up to `axis`. Hillis-Steele
    doubling: `ceil(log2 K)` rounds of one shift and one `combine` each, with
    no subtraction (exact for sums, stable for log-sum-exp merges), and
    every round differentiable.

    Args:
        gates: bool `[..., K]`, `axis = len(gates.shape) - 1`.
        items: tuple of tensors `[..., K, ...]`.
        combine: `(earlier, later) -> merged`, on tuples like `items`; associative.
        axis: int, the scanned axis.
    """
    items = tuple(items)
    size = ops.shape(gates)[axis]

    def expand(mask, x):
        return ops.reshape(mask, (*ops.shape(mask), *[1] * (len(x.shape) - len(mask.shape))))

    def body(steps, gates, *items):
        # Entry k holds the span (k - steps, k]; it takes the span before it unless a barrier is in its own.
        merged = combine(tuple(shift_right(x, axis, 0, steps) for x in items), items)
        take = ops.logical_and(gates, ops.arange(size, dtype="int32") >= steps)
        items = tuple(ops.where(expand(take, x), m, x) for m, x in zip(merged, items))
        # The first `steps` entries are complete prefixes: whatever their gate, nothing lies before them.
        return (steps * 2, ops.logical_and(gates, shift_right(gates, axis, False, steps)), *items)

    static_size = gates.shape[axis]
    if static_size is None:  # a length unknown at tracing (TensorFlow alone traces those)
        _, _, *items = ops.while_loop(lambda steps, *_: steps < size, body, (ops.convert_to_tensor(1), gates, *items))
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
    index = ops.arange(length, dtype="int32")[None, :]
    if start is not None:
        index = index + ops.cast(start, "int32")[:, None]
    if document_starts is not None:
        ones = ops.ones_like(document_starts, "int32")
        (count,) = gated_scan(ops.logical_not(document_starts), (ones,), lambda a, b: (a[0] + b[0],), axis=1)
        index = ops.where(ops.cumsum(ops.cast(document_starts, "int32"), axis=1) > 0, count - 1, index)
    return index


def position_after(index, start, end):
    """The index after each row's last real position: `index [B, T]` at `end - 1`, plus 1 (`start` where `end = 0`)."""
    end = ops.broadcast_to(end, ops.shape(start))
    last = gather_rows(pad_axis(index, 1, 1), ops.maximum(end - 1, 0)[:, None], 1)[:, 0]
    return ops.where(end > 0, last + 1, start)
