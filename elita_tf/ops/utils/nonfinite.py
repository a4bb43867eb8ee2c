"""NaN and Inf inputs kept from travelling back in time through a causal token mixer."""

import keras
from keras import ops

from elita_tf import backend
from elita_tf.ops.utils.dtypes import is_float
from elita_tf.ops.utils.positions import pad_axis


def contain_nonfinite(compute, inputs, padding_mask=None):
    """Runs a causal token mixer so that a NaN or Inf input cannot travel back in time.

    Chunked kernels contract whole chunks with matrix products, where a
    weight of exactly zero still meets every value of the chunk: `0 * NaN`
    is NaN, so one bad position would spoil the earlier rows of its chunk
    (and a padded position holding NaN would spoil every row). Here the
    mixer never sees a bad value:

    - every NaN or Inf element is replaced by zero for the computation
      (a select, not a product). At padding (False in `padding_mask`)
      that is all: the mixer already keeps a padded position out of every
      other row, so it reaches no output;
    - at a real position `t`, every output row `>= t` is then set to NaN, and so is
      every float tensor of the returned cache: the state after a
      non-finite input is non-finite, so decoding from it agrees with the
      parallel form. Rows before `t` are exactly as without the bad value.

        bad input at t = 2:   row 0 1 2 3 4
        outputs:                  ok ok NaN NaN NaN

    The rule is the same for every layer, windowed or not (all rows from
    `t` on): conservative past a window, and never a plausible number where
    a bad value was in reach.

    Args:
        compute: `compute(clean_inputs)` -> `outputs [B, T, ...]` or
            `(outputs, cache)`.
        inputs: float tensor `[B, T, d]`.
        padding_mask: optional bool `[B, T]`, False at padding.

    Returns:
        What `compute` returns, with the rules above applied.
    """
    finite = ops.isfinite(inputs)  # [B, T, d]
    # XLA fuses each reduction of `finite` below into one pass; elsewhere rows first, so that the rest are small.
    rows = finite if backend.compiled_or_on_gpu() else ops.all(finite, axis=-1, keepdims=True)
    # Without a bad value the inputs go through as they are on a CPU: a new tensor over the same memory, which
    # carries no Keras mask (the mixer's own layers would warn that they drop it), and no copy (`ops.copy` is one
    # on PyTorch), which the mixer's projections would keep for the backward pass beside the norm's output.
    clean = backend.branch_or_select(
        ops.all(rows),
        lambda: ops.reshape(inputs, ops.shape(inputs)),
        lambda: ops.where(finite, inputs, ops.zeros((), inputs.dtype)),
    )
    result = compute(clean)
    bad = ops.logical_not(rows)
    if padding_mask is not None:
        bad = ops.logical_and(bad, ops.cast(padding_mask, "bool")[..., None])  # real positions that hold NaN or Inf
    # The first bad real position of each row, or T: a minimum, where a running count over time would take
    # several passes (and kernels) under XLA.
    length = ops.shape(inputs)[1]
    candidates = ops.where(bad, ops.arange(length, dtype="int32")[None, :, None], length)
    if not (isinstance(length, int) and length > 0):  # a minimum over no position is an error off TensorFlow
        candidates = pad_axis(candidates, 1, 1, length)
    first_bad = ops.min(candidates, axis=(1, 2))  # [B]; T where there is none
    poisoned = ops.arange(length, dtype="int32")[None, :] >= first_bad[:, None]  # [B, T]: rows at or after one

    def poison_rows(x):
        mask = ops.reshape(poisoned, (*ops.shape(poisoned), *[1] * (len(x.shape) - 2)))
        return ops.where(mask, backend.full((), float("nan"), x.dtype), x)

    if not isinstance(result, tuple):
        return poison_rows(result)
    outputs, cache = result
    any_bad = first_bad < length  # [B]
    return poison_rows(outputs), keras.tree.map_structure(lambda x: nan_rows(any_bad, x), cache)


def nan_rows(rows, x):
    """`x [B, ...]` with every entry of the batch rows where `rows [B]` is True made NaN; `x` itself unless float.

    What a causal mixer returns where it has no right value to give, and no check can say so (`jax.jit`, XLA
    drop them): a state after a non-finite input, or a decoding buffer written past its end.
    """
    if not is_float(x) or len(x.shape) == 0:
        return x
    mask = ops.reshape(rows, (*ops.shape(rows), *[1] * (len(x.shape) - 1)))
    return ops.where(mask, backend.full((), float("nan"), x.dtype), x)
