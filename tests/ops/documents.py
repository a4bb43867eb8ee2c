"""Running an op one document at a time: what an op given `document_starts` must equal."""

import numpy as np
from keras import ops


def random_document_starts(batch, length, seed=0):
    """Bool `[B, T]` with documents of 1 to ~20 positions, a reset at 0 in one row, two in a row in another."""
    rng = np.random.default_rng(seed)
    document_starts = rng.random((batch, length)) < 0.08
    document_starts[0, 0] = True
    if length > 3:
        document_starts[-1, 1:3] = True
    return document_starts


def by_document(call, inputs, document_starts, initial_state):
    """Outputs and final states of `call` run on each document of each row apart.

    Args:
        call: `(inputs, initial_state) -> (outputs tuple, state tuple)` on one
            row's slices `[1, H, t, ...]` (time on axis 2).
        inputs: tuple of `[B, H, T, ...]` tensors.
        document_starts: numpy bool `[B, T]`.
        initial_state: tuple of `[B, ...]` tensors: the first document of a
            row continues from it unless that row starts with a reset.

    Returns:
        `(outputs, state)`: each output concatenated over time, each state
        tensor stacked over rows.
    """
    rows_out, rows_state = [], []
    for row in range(document_starts.shape[0]):
        starts = sorted({0, *np.flatnonzero(document_starts[row])}) + [document_starts.shape[1]]
        state = (
            tuple(t[row : row + 1] for t in initial_state) if initial_state and not document_starts[row, 0] else None
        )
        pieces = []
        for start, end in zip(starts[:-1], starts[1:]):
            if start > 0:
                state = None  # a document starts here
            outputs, state = call(tuple(t[row : row + 1, :, start:end] for t in inputs), state)
            pieces.append(outputs)
        rows_out.append([ops.concatenate(parts, axis=2) for parts in zip(*pieces)])
        rows_state.append(state)
    outputs = [ops.concatenate(parts, axis=0) for parts in zip(*rows_out)]
    return outputs, [ops.concatenate(parts, axis=0) for parts in zip(*rows_state)]
