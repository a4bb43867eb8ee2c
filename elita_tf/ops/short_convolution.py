"""A short causal convolution, depthwise: each channel a weighted sum of its own last `K` inputs.

With a kernel `w [K, d]` (row `K - 1` weighs the current input) and an optional bias `b [d]`:

    y_t = b + Σ_{j<K} w_j ⊙ x_{t - (K - 1) + j}

    row 0: x . . . .
    row 1: x x . . .      the last K = 3 positions, a weight per lag and channel
    row 2: x x x . .
    row 3: . x x x .

An input before the sequence, at padding or before the current document's start is 0: it adds
nothing. Forms:
- `short_convolution`: `K` shifted copies of the input, weighted and summed: O(T K d), no `[T, T]`.
- `short_convolution_step`: one decoding step from the state, the last `K - 1` inputs `[B, K - 1, d]`.
Sums are float32 (float64 stays float64) whatever the input dtype.
"""

from keras import ops

from elita_tf.ops.utils.documents import document_index
from elita_tf.ops.utils.dtypes import accumulator_dtype
from elita_tf.ops.utils.positions import real_extent, window_after


def empty_short_convolution_state(batch_size, kernel_size, width, dtype="float32"):
    """The last `K - 1` inputs before any position: zeros `[B, K - 1, d]`."""
    return ops.zeros((batch_size, kernel_size - 1, width), accumulator_dtype(dtype))


def _inputs(inputs, kernel, mask):
    dtype = accumulator_dtype(inputs.dtype)
    inputs = ops.cast(inputs, dtype)
    if mask is not None:
        inputs = ops.where(ops.cast(mask, "bool")[..., None], inputs, 0.0)
    return inputs, ops.cast(kernel, dtype)


def short_convolution(inputs, kernel, bias=None, mask=None, initial_state=None, document_starts=None):
    """The short causal convolution over a sequence, continuing `initial_state` when given.

    Args:
        inputs: float `[B, T, d]`.
        kernel: float `[K, d]`, `K >= 1`; row `K - 1` weighs the current input.
        bias: optional float `[d]`.
        mask: optional bool `[B, T]`, False at padding: a padded input is 0. Each row's state ends after its
            last real position: right padding is not part of the sequence.
        initial_state: optional `[B, K - 1, d]`, the inputs before these (`empty_short_convolution_state`,
            a previous call or step).
        document_starts: optional bool `[B, T]`, True where a document starts: nothing before it (the state
            included) is seen from there on, and the returned state holds the last document alone.

    Returns:
        `(outputs [B, T, d], state [B, K - 1, d])`, both in the accumulator dtype.
    """
    inputs, kernel = _inputs(inputs, kernel, mask)
    size, length = kernel.shape[0], ops.shape(inputs)[1]
    if initial_state is None:
        initial_state = empty_short_convolution_state(ops.shape(inputs)[0], size, ops.shape(inputs)[2], inputs.dtype)
    sequence = ops.concatenate([ops.cast(initial_state, inputs.dtype), inputs], axis=1)  # [B, K - 1 + T, d]
    if document_starts is not None:
        # The state's positions are document 0; a start makes every later position another.
        documents = ops.pad(document_index(document_starts), [[0, 0], [size - 1, 0]])  # [B, K - 1 + T]
    outputs = 0.0
    for j in range(size):
        shifted = sequence[:, j : j + length]
        if document_starts is not None:
            same = ops.equal(documents[:, j : j + length], documents[:, size - 1 :])
            shifted = ops.where(same[..., None], shifted, 0.0)
        outputs = outputs + kernel[j] * shifted
    if bias is not None:
        outputs = outputs + ops.cast(bias, inputs.dtype)
    if size == 1:  # no state: each output sees its own input alone
        return outputs, sequence[:, :0]
    end = real_extent(mask, length)
    state = window_after(sequence, end, size - 1, axis=1)
    if document_starts is not None:
        # Positions of an earlier document than the last one's leave the state: the next call must not see them.
        state_documents = window_after(documents, end, size - 1, axis=1)  # [B, K - 1], the last one the newest
        state = ops.where(ops.equal(state_documents, state_documents[:, -1:])[..., None], state, 0.0)
    return outputs, state


def short_convolution_step(state, inputs, kernel, bias=None, mask=None):
    """One decoding step of `short_convolution`.

    Args:
        state: `[B, K - 1, d]`, from `empty_short_convolution_state`, `short_convolution` or a previous step.
        inputs: float `[B, d]`, the new position's input.
        kernel, bias: as in `short_convolution`.
        mask: optional bool `[B]`; False makes the new input 0, as a padded position.

    Returns:
        `(outputs [B, d], new_state)`, equal to the last row of `short_convolution` over all positions so far.
    """
    inputs, kernel = _inputs(inputs[:, None], kernel, None if mask is None else mask[:, None])
    window = ops.concatenate([ops.cast(state, inputs.dtype), inputs], axis=1)  # [B, K, d]
    outputs = ops.sum(window * kernel[None], axis=1)
    if bias is not None:
        outputs = outputs + ops.cast(bias, inputs.dtype)
    return outputs, window[:, 1:]
