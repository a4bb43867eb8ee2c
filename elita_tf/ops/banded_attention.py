"""Causal banded softmax attention without the diagonal, with a null slot (docs/math.md §6).

The attention of the 3Lin layer. Row `t` attends the earlier positions
`j < t` of its window, the start position `0` (always, however far), and a
null slot of logit 0 and value 0:

    l_tj  = scale * q_t·k_j + bias(t - j),   bias(Δ) = -slope * Δ + hyper / Δ
    out_t = Σ_{j∈Span(t)} exp(l_tj) v_j / (1 + Σ_{j∈Span(t)} exp(l_tj))
    Span(t) = {j : t - window < j < t} ∪ {0 if t >= 1}     (all j < t if window is None)

    window = 3, s = start position, x = window, . = unseen (the diagonal too)
    row 0: . . . . . .      only the null slot: out_0 = 0
    row 1: s . . . . .
    row 2: s x . . . .
    row 3: s x x . . .
    row 4: s . x x . .
    row 5: s . . x x .

`slope` and `hyper` are in nats here; the 3Lin layer passes its bits times
ln 2. Every exponent taken is `l - m <= 0` with `m` the row's maximum over its
visible logits and the null slot's 0, so nothing overflows; all arithmetic is
float32 (float64 stays float64) whatever the input dtype.

Forms (every tensor `[B, H, T, ...]`; fold 3Lin's single head as `H = 1`):
- `banded_attention`: the parallel training form. With a `window`, queries
  are cut into chunks of `C` positions and each chunk is scored against the
  `C + window - 2` keys its band can reach: O(T * (C + window) * D) time and
  memory, no `[T, T]` tensor. With `window=None` (3Lin's "wide" layers) it is
  plain masked attention, O(T^2): bilinear logits `q_t·k_j` have no O(T)
  form.
- `banded_attention_step` (`banded_attention_step.py`): one decoding step from the state.
- `elita_tf.ops.reference.banded_attention_reference`: the naive O(T^2) definition, for tests.

State (functional, fixed shape): `(keys [B, H, S, Dk], values [B, H, S, Dv],
valid [B, S] bool, index [B] int32)`. With a window, `S = window`: slot 0 holds
the start position, slots `1 .. window - 1` the last `window - 1` positions
(oldest first). Without, `S = max_sequence_length`: slot `n` holds position `n`.
`index` is each row's number of positions seen.
"""

import math

import numpy as np
from keras import ops

from elita_tf import backend
from elita_tf.checks import check_integer, fail, is_integer
from elita_tf.ops.utils.documents import document_positions
from elita_tf.ops.utils.dtypes import NEG_INF, accumulator_dtype, dtype_of
from elita_tf.ops.utils.nonfinite import nan_rows
from elita_tf.ops.utils.positions import (
    gather_rows,
    max_at_least,
    pad_axis,
    real_extent,
    window_after,
    write_positions,
)
from elita_tf.renames import accepts_renamed_arguments

BANDED_CHUNK_SIZE = 32


def check_window(window):
    if not (window is None or (is_integer(window) and window >= 2)):
        reason = "the current position is never attended, so window 1 would see nothing but the start position"
        fail("window", window, f"None or an integer >= 2 ({reason})")


def empty_banded_state(
    batch_size, num_heads, key_dim, value_dim, window=None, max_sequence_length=None, dtype="float32"
):
    """The state before any position, for `banded_attention(_step)`.

    Args:
        batch_size: int `B`.
        num_heads: int `H`.
        key_dim: int `Dk`, the width of queries and keys.
        value_dim: int `Dv`.
        window: None or int >= 2, as in `banded_attention`.
        max_sequence_length: int, the positions a state without a window can hold.
        dtype: the input dtype; the state is float32 (float64 for float64).

    Returns:
        `(keys [B, H, S, Dk], values [B, H, S, Dv], valid [B, S], index [B])`,
        zeros, all slots invalid, `S = window` or `max_sequence_length`.
    """
    check_window(window)
    if window is None:  # the state holds every position
        check_integer("max_sequence_length", max_sequence_length)
    dtype = accumulator_dtype(dtype)
    slots = window if window is not None else max_sequence_length
    return (
        ops.zeros((batch_size, num_heads, slots, key_dim), dtype),
        ops.zeros((batch_size, num_heads, slots, value_dim), dtype),
        ops.zeros((batch_size, slots), "bool"),
        ops.zeros((batch_size,), "int32"),
    )


def distance_bias(distance, slope, hyper):
    """`-slope * Δ + hyper / Δ` (0 where `Δ < 1`), for a NumPy or backend (float) `Δ`."""
    if isinstance(distance, np.ndarray):
        d = np.maximum(distance, 1).astype(np.float64)
        return np.where(distance >= 1, -slope * d + hyper / d, 0.0)
    # A select rather than `maximum`, which Keras computes in float32 for float64 on PyTorch.
    ahead = distance >= 1
    d = ops.where(ahead, distance, 1.0)
    return ops.where(ahead, -slope * d + hyper / d, 0.0)


def _null_softmax(scores, values_fn, extra=None):
    """`Σ exp(s) v / (1 + Σ exp(s))` over the last axis, stably.

    `scores [..., S]` hold `NEG_INF` where unseen; `extra` is an optional
    `(logit [...], weighted_value_fn)` for one more slot. `values_fn(weights)`
    returns `Σ_S weights * v`.
    """
    # The null slot's logit 0 is in the max: exp(-m) <= 1 and every weight <= 1 (and a row of no
    # slots, T = 0, has a maximum).
    row_max = max_at_least(scores, 0.0, axis=-1)
    if extra is not None:
        row_max = ops.maximum(row_max, extra[0])
    # Any `m` gives the same quotient: one that Keras' `maximum` rounded to float32 (PyTorch, float64 logits) shifts
    # as well, once back in the logits' dtype (a no-op elsewhere).
    row_max = ops.stop_gradient(ops.cast(row_max, dtype_of(scores)))
    weights = ops.exp(scores - row_max[..., None])
    denominator = ops.exp(-row_max) + ops.sum(weights, axis=-1)
    numerator = values_fn(weights)
    if extra is not None:
        extra_weight = ops.exp(extra[0] - row_max)
        denominator = denominator + extra_weight
        numerator = numerator + extra[1](extra_weight)
    return numerator / denominator[..., None]


def dense_attention(
    queries, keys, values, key_valid, query_pos, key_pos, window, slope, hyper, scale, same_document=None
):
    """Masked attention of `[B, H, T, Dk]` queries at `query_pos [B, T]` over `[B, H, S, *]` keys at `key_pos [B, S]`.

    O(T * S): the form without a window, and one decoding step. `same_document`,
    optional `[B, T, S]` bool, keeps each query to the keys of its document.
    """
    dtype = dtype_of(queries)
    delta = query_pos[:, :, None] - key_pos[:, None, :]  # [B, T, S]
    visible = delta >= 1
    if window is not None:
        visible = ops.logical_and(visible, ops.logical_or(delta <= window - 1, ops.equal(key_pos, 0)[:, None, :]))
    if same_document is not None:
        visible = ops.logical_and(visible, same_document)
    visible = ops.logical_and(visible[:, None], key_valid[:, None, None, :])  # [B, 1, T, S]
    bias = distance_bias(ops.cast(delta, dtype), slope, hyper)[:, None]
    scores = ops.einsum("bhtq,bhsq->bhts", queries, keys) * scale + bias
    scores = ops.where(visible, scores, NEG_INF)
    return _null_softmax(scores, lambda w: ops.einsum("bhts,bhsd->bhtd", w, values))


def _banded(
    queries, keys, values, key_valid, start, position, window, slope, hyper, scale, chunk_size, document_indices=None
):
    """The windowed form in chunks of `C` queries.

    `keys [B, H, W - 1 + T, Dk]` are the `W - 1` positions before the queries
    (from the state) and the queries' own; `key_valid [B, W - 1 + T]` already
    excludes position 0, which is the separate `start = (key, value, valid)`:
    `[B, H, Dk]`, `[B, H, Dv]`, `[B]`, or one start per query (`[B, H, T, Dk]`,
    `[B, H, T, Dv]`, `[B, T]`) with packed documents. `position [B, T]` is
    each query's distance from its start. `document_indices`, optional
    `(query [B, T], key [B, W - 1 + T])` int ids, keeps each query to the keys
    of its own document.
    The query at offset `i` of chunk `c` sits at key index `cC + i + W - 1`
    and sees key slots `m ∈ [i, i + W - 2]` of the chunk's frame of
    `C + W - 2` keys starting at `cC`:

        C = 3, W = 3: frame slots 0 1 2 3 4
        query 0:                 x x . . .
        query 1:                 . x x . .
        query 2:                 . . x x .
    """
    dtype = dtype_of(queries)
    batch, heads, length = ops.shape(queries)[0], ops.shape(queries)[1], ops.shape(queries)[2]
    key_dim, value_dim = ops.shape(keys)[-1], ops.shape(values)[-1]
    size, span = chunk_size, chunk_size + window - 2
    chunks = (length + size - 1) // size
    pad = chunks * size - length
    q = ops.reshape(pad_axis(queries, 2, pad), (batch, heads, chunks, size, key_dim))
    frames = ops.arange(chunks, dtype="int32")[:, None] * size + ops.arange(span, dtype="int32")[None, :]  # [K, span]
    k = ops.take(pad_axis(keys, 2, pad), frames, axis=2)  # [B, H, K, span, Dk]
    v = ops.take(pad_axis(values, 2, pad), frames, axis=2)
    ok = ops.take(pad_axis(key_valid, 1, pad, False), frames, axis=1)  # [B, K, span]

    offset = np.arange(size)[:, None] + window - 1 - np.arange(span)[None, :]  # Δ, [C, span]
    band = ops.convert_to_tensor((offset >= 1) & (offset <= window - 1))
    bias = ops.convert_to_tensor(distance_bias(offset, slope, hyper), dtype)
    scores = ops.einsum("bhkiq,bhkmq->bhkim", q, k) * scale + bias
    visible = ops.logical_and(band[None, None, None], ok[:, None, :, None, :])
    if document_indices is not None:
        query_document = ops.reshape(pad_axis(document_indices[0], 1, pad, -1), (batch, chunks, size))
        key_document = ops.take(pad_axis(document_indices[1], 1, pad, -2), frames, axis=1)  # [B, K, span]
        visible = ops.logical_and(visible, ops.equal(query_document[..., :, None], key_document[..., None, :])[:, None])
    scores = ops.where(visible, scores, NEG_INF)  # [B, H, K, C, span]

    # The start position: one more slot per row, at distance `position`.
    start_key, start_value, start_valid = start
    if len(start_key.shape) == 3:  # one start for every query of a row
        start_key, start_value, start_valid = start_key[:, :, None], start_value[:, :, None], start_valid[:, None]
    start_logit = ops.sum(queries * start_key, axis=-1) * scale
    start_logit = start_logit + distance_bias(ops.cast(position, dtype), slope, hyper)[:, None]
    start_visible = ops.logical_and(start_valid[:, None], (position >= 1)[:, None])
    start_logit = ops.where(start_visible, start_logit, NEG_INF)
    start_logit = ops.reshape(pad_axis(start_logit, 2, pad, NEG_INF), (batch, heads, chunks, size))
    if start_value.shape[2] == 1:
        start_value = start_value[:, :, None]  # [B, H, 1, 1, Dv]
    else:
        start_value = ops.reshape(pad_axis(start_value, 2, pad), (batch, heads, chunks, size, value_dim))

    out = _null_softmax(
        scores,
        lambda w: ops.einsum("bhkim,bhkmd->bhkid", w, v),
        extra=(start_logit, lambda w: w[..., None] * start_value),
    )
    return ops.reshape(out, (batch, heads, chunks * size, value_dim))[:, :, :length]


def prepare_inputs(queries, keys, values, mask, scale):
    dtype = accumulator_dtype(values.dtype)
    queries, keys, values = (ops.cast(x, dtype) for x in (queries, keys, values))
    if scale is None:
        scale = 1.0 / math.sqrt(queries.shape[-1])
    if mask is None:
        valid = ops.ones((ops.shape(keys)[0], ops.shape(keys)[2]), "bool")  # [B, T]
    else:
        valid = ops.cast(mask, "bool")
        # A padded position's key and value are stored as zeros whatever they held: a weight of
        # exactly 0 times NaN would still be NaN.
        keys = ops.where(valid[:, None, :, None], keys, 0.0)
        values = ops.where(valid[:, None, :, None], values, 0.0)
    return queries, keys, values, valid, scale


@accepts_renamed_arguments
def banded_attention(
    queries,
    keys,
    values,
    window=None,
    slope=0.0,
    hyper=0.0,
    scale=None,
    mask=None,
    initial_state=None,
    document_starts=None,
    chunk_size=BANDED_CHUNK_SIZE,
):
    """Causal banded attention without the diagonal, plus start and null slots, parallel over time.

    Args:
        queries: float tensor `[B, H, T, Dk]`.
        keys: float tensor `[B, H, T, Dk]`.
        values: float tensor `[B, H, T, Dv]`.
        window: None (every earlier position) or an int >= 2: row `t` sees
            positions `t - window < j < t`, i.e. `window - 1` of them, and
            the start position 0.
        slope: float. Penalty per position of distance, in nats. Defaults to `0.0`.
        hyper: float. Bonus `hyper / Δ`, in nats. Defaults to `0.0`.
        scale: float or None. Multiplies `q·k`. Defaults to `1 / sqrt(Dk)`.
        mask: optional bool `[B, T]`, False at padding: a padded position is
            no key of any row (its own row is computed as usual). Each row's
            state ends after its last real position: right padding is not
            part of the sequence, and what follows overwrites it.
        initial_state: optional state of the positions before these, from
            `empty_banded_state()` or a previous call (prefill, then continue).
            Needed to continue a sequence without a window (its size is the
            `max_sequence_length` it can hold).
        document_starts: optional bool `[B, T]`, True where a document starts (packed
            documents): each document is its own sequence, with its own start
            position and distances counted from it, and sees nothing of
            another. Not with `initial_state`.
        chunk_size: int `C`, queries per chunk of the windowed form.

    Returns:
        `(out, state)`: `out [B, H, T, Dv]` in the accumulator dtype (float32
        unless the values are float64) and the state after the last position
        (None with `document_starts`: a state holds one document). Without a window and
        without `initial_state`, the state's buffer holds exactly these `T`
        positions.
    """
    check_window(window)
    if document_starts is not None and initial_state is not None:
        raise ValueError(
            "`document_starts` (packed documents) start each document afresh; they do not continue an `initial_state`. "
            f"Received: document_starts={document_starts!r} with an initial_state"
        )
    queries, keys, values, valid, scale = prepare_inputs(queries, keys, values, mask, scale)
    batch, heads = ops.shape(keys)[0], ops.shape(keys)[1]
    length = ops.shape(keys)[2]
    if document_starts is not None:
        return _packed(queries, keys, values, valid, document_starts, window, slope, hyper, scale, chunk_size), None
    # Each row's state ends after its last real position: right padding is overwritten by what follows.
    end = ops.broadcast_to(real_extent(mask, length), (batch,))

    if window is None:
        if initial_state is None:
            buffer_keys, buffer_values, buffer_valid, index = keys, values, valid, ops.zeros((batch,), "int32")
            slots = length
        else:
            buffer_keys, buffer_values, buffer_valid, index = initial_state
            slots = ops.shape(buffer_keys)[2]
            backend.check_less_equal(
                ops.max(index) + length, slots, "The state holds fewer positions than the sequence needs"
            )
            buffer_keys = write_positions(buffer_keys, keys, index, axis=2)
            buffer_values = write_positions(buffer_values, values, index, axis=2)
            buffer_valid = write_positions(buffer_valid, valid, index, axis=1)
            buffer_values = nan_rows(index + length > slots, buffer_values)  # where no check runs: NaN, not a guess
        out = dense_attention(
            queries,
            buffer_keys,
            buffer_values,
            buffer_valid,
            index[:, None] + ops.arange(length, dtype="int32")[None, :],
            ops.broadcast_to(ops.arange(slots, dtype="int32")[None, :], (batch, slots)),
            None,
            slope,
            hyper,
            scale,
        )
        return out, (buffer_keys, buffer_values, buffer_valid, index + end)

    if initial_state is None:
        initial_state = empty_banded_state(
            batch, heads, ops.shape(keys)[3], ops.shape(values)[3], window=window, dtype=values.dtype
        )
    state_keys, state_values, state_valid, index = initial_state
    state_keys, state_values = ops.cast(state_keys, keys.dtype), ops.cast(state_values, values.dtype)
    # The start position is the state's, or the first input in a row where nothing came before.
    fresh = ops.equal(index, 0)  # [B]

    def start_of(state_part, new_part, axis):
        first = ops.take(ops.concatenate([new_part, state_part], axis=axis), 0, axis=axis)
        own = ops.take(state_part, 0, axis=axis)
        return ops.where(ops.reshape(fresh, [-1] + [1] * (len(own.shape) - 1)), first, own)

    start_key = start_of(state_keys[:, :, :1], keys[:, :, :1], axis=2)
    start_value = start_of(state_values[:, :, :1], values[:, :, :1], axis=2)
    start_valid = start_of(state_valid[:, :1], valid[:, :1], axis=1)

    all_keys = ops.concatenate([state_keys[:, :, 1:], keys], axis=2)  # [B, H, W - 1 + T, Dk]
    all_values = ops.concatenate([state_values[:, :, 1:], values], axis=2)
    all_valid = ops.concatenate([state_valid[:, 1:], valid], axis=1)
    position = index[:, None] - (window - 1) + ops.arange(window - 1 + length, dtype="int32")[None, :]  # [B, W - 1 + T]
    key_valid = ops.logical_and(all_valid, position >= 1)
    out = _banded(
        queries,
        all_keys,
        all_values,
        key_valid,
        (start_key, start_value, start_valid),
        index[:, None] + ops.arange(length, dtype="int32")[None, :],
        window,
        slope,
        hyper,
        scale,
        chunk_size,
    )
    state = (
        ops.concatenate([start_key[:, :, None], window_after(all_keys, end, window - 1, axis=2)], axis=2),
        ops.concatenate([start_value[:, :, None], window_after(all_values, end, window - 1, axis=2)], axis=2),
        ops.concatenate([start_valid[:, None], window_after(all_valid, end, window - 1, axis=1)], axis=1),
        index + end,
    )
    return out, state


def _packed(queries, keys, values, valid, document_starts, window, slope, hyper, scale, chunk_size):
    """`banded_attention`'s output on packed documents: every document as if it were run alone.

    A document's first position plays the start position for its queries,
    and every distance is the same as in the document alone:

        document_starts 1 0 0 1 0 0, window 2 (s = the document's start, x = window)
        row 3: . . . . . .      a new document: only the null slot
        row 4: . . . s . .
        row 5: . . . s x .
    """
    batch, length = ops.shape(keys)[0], ops.shape(keys)[2]
    document_starts = ops.cast(document_starts, "bool")
    position = document_positions(length, None, document_starts) * ops.ones((batch, 1), "int32")  # [B, T] from the start
    document = ops.cumsum(ops.cast(document_starts, "int32"), axis=1)
    if window is None:
        at = ops.broadcast_to(ops.arange(length, dtype="int32")[None, :], (batch, length))
        same = ops.equal(document[:, :, None], document[:, None, :])
        return dense_attention(queries, keys, values, valid, at, at, None, slope, hyper, scale, same_document=same)

    start_index = ops.arange(length, dtype="int32")[None, :] - position  # each query's document start
    heads = ops.shape(keys)[1]
    # Row (b, h)'s start of query t is entry (b * H + h) * T + start_index[b, t] of the keys as one list of
    # positions: one gather of whole positions, as TensorFlow's `gather(batch_dims=2)` does.
    rows = ops.reshape(ops.arange(batch * heads, dtype="int32") * length, (batch, heads, 1))
    flat_index = rows + start_index[:, None]  # [B, H, T]

    def gather_start(x):
        return ops.take(ops.reshape(x, (-1, ops.shape(x)[3])), flat_index, axis=0)

    start = (gather_start(keys), gather_start(values), gather_rows(valid, start_index, axis=1))
    # The W - 1 slots before the first query hold nothing; a document's start is no key of the band.
    before = window - 1
    all_keys, all_values = (ops.pad(x, [[0, 0], [0, 0], [before, 0], [0, 0]]) for x in (keys, values))
    key_valid = ops.concatenate([ops.zeros((batch, before), "bool"), ops.logical_and(valid, position >= 1)], axis=1)
    key_document = ops.concatenate([backend.full((batch, before), -1, "int32"), document], axis=1)
    return _banded(
        queries,
        all_keys,
        all_values,
        key_valid,
        start,
        position,
        window,
        slope,
        hyper,
        scale,
        chunk_size,
        document_indices=(document, key_document),
    )
