"""Stable causal softmax-weighted means with key-only logits (docs/math.md §1).

For logits `l [B, H, T]` and values `x [B, H, T, D]` row `i` is

    mean_i = Σ_{j∈W(i)} exp(l_j) x_j / Σ_{j∈W(i)} exp(l_j)
    logZ_i = log Σ_{j∈W(i)} exp(l_j)

with `W(i) = {j <= i}` (global) or the last `window` positions (windowed):

    global          window = 3
    row 0: x . . .  x . . . .
    row 1: x x . .  x x . . .
    row 2: x x x .  x x x . .
    row 3: x x x x  . x x x .

This is the shared primitive of ELiTA `Attention2` and additive attention.

Every exponent taken here is `l_j - L_i <= 0` with `L_i` a log-sum-exp
over a set that holds `l_j`: nothing overflows for any logit range, and there
is no cumulative sum difference that can cancel. All arithmetic is float32
(float64 stays float64) whatever the input dtype.

Forms:
- `causal_softmax_mean`: the parallel training form. Chunks of `C` positions
  are combined with `C x C` matrix products; chunks are linked by the same
  scheme one level up (chunks of chunks), and the few top-level blocks by
  one more product. Inside a chunk, `L` and the weights are factored around
  the chunk's first normaliser (`decayed_prefix.chunk_factors`), exact while
  no logit rises more than a span above it; rows past one take the
  exponential forms. Under XLA and on a GPU the global case takes the direct
  form instead (`direct_softmax_mean`): each chunk's weights as exponentials
  against a causal running maximum, fewer operations. Time and memory are O(T * C * D) for the global
  case and for every window size (windowed: banded chunks for
  `window <= C`; beyond, a prefix and a suffix inside chunks with a
  windowed mean over the whole chunks between, the same cost).
- `causal_softmax_mean_step`: the one-step recurrent form for decoding, from a
  constant-size state (global) or a ring buffer of `window` entries.
"""

from keras import ops

from elita_tf import backend
from elita_tf.checks import check_choice, check_integer
from elita_tf.ops.decayed_prefix import chunk_factors, decayed_prefix, logaddexp
from elita_tf.ops.direct_softmax_mean import direct_softmax_mean
from elita_tf.ops.utils.documents import document_index, gated_scan
from elita_tf.ops.utils.dtypes import NEG_INF, UNSEEN_LOGIT, accumulator_dtype
from elita_tf.ops.utils.positions import gather_rows, leading, pad_axis, real_extent, static_size, window_after
from elita_tf.ops.windowed_softmax_mean import banded_mean, merge_means, pad_time, windowed_mean
from elita_tf.renames import accepts_renamed_arguments

SOFTMAX_MEAN_CHUNK_SIZE = 32
# The forms of the global mean (`causal_softmax_mean(form=...)`); None chooses by where the graph runs.
MEAN_FORMS = (None, "factored", "direct")


def empty_softmax_mean_state(batch_size, num_heads, head_dim, window=None, dtype="float32"):
    """The state before any position, for `causal_softmax_mean(_step)`.

    Returns:
        Global (`window=None`): `(log_z [B, H], mean [B, H, D])`, the running
        normaliser and mean. Windowed: `(logits [B, H, window],
        values [B, H, window, D])`, a ring buffer of the last `window` inputs
        (oldest first).
    """
    dtype = accumulator_dtype(dtype)
    if window is None:
        log_z = backend.full([batch_size, num_heads], NEG_INF, dtype)
        return log_z, ops.zeros([batch_size, num_heads, head_dim], dtype)
    logits = backend.full([batch_size, num_heads, window], NEG_INF, dtype)
    return logits, ops.zeros([batch_size, num_heads, window, head_dim], dtype)


def _check_window(window):
    check_integer("window", window, optional=True)


def _prepare(logits, values, mask):
    """Casts to the accumulator dtype; masked positions get no weight and zero value."""
    dtype = accumulator_dtype(values.dtype)
    logits = ops.cast(logits, dtype)
    values = ops.cast(values, dtype)
    if mask is not None:
        mask = ops.cast(mask, "bool")[:, None, :]  # [B, 1, T]
        logits = ops.where(mask, logits, NEG_INF)
        # Without padding (a packed batch) on a CPU the values go through as they are: a zeroed copy of them is
        # what the backward pass would keep, beside the values themselves that the layer keeps.
        values = backend.branch_or_select(
            ops.all(mask), lambda: values, lambda: ops.where(mask[..., None], values, ops.zeros((), values.dtype))
        )
    return logits, values


def _global_chunked(logits, values, chunk_size):
    """Global causal mean of `[N, T]` logits and `[N, T, D]` values.

    With `L_i = logcumsumexp(l)_i`, the mean is `Σ_{j<=i} exp(l_j - L_i) x_j`:
    a decayed prefix sum with weights <= 1, done in chunks at two levels
    (tokens, then chunks). The values enter the chunks' matrix products as
    they are, with no weighted copy of them first.
    """
    length = static_size(logits, 1)
    # At least one chunk, so that T = 0 needs no special case below.
    if isinstance(length, int):
        pad = (-length) % chunk_size + (chunk_size if length == 0 else 0)
    else:
        pad = (-length) % chunk_size + chunk_size * ops.cast(ops.equal(length, 0), "int32")
    logits = pad_axis(logits, 1, pad, NEG_INF)
    values = pad_axis(values, 1, pad)
    factors = chunk_factors(ops.reshape(logits, [-1, (length + pad) // chunk_size, chunk_size]))
    factored_log_z = ops.reshape(factors.log_z, ops.shape(logits))  # [N, T']
    log_z = backend.branch_or_select(
        factors.within,
        lambda: factored_log_z,
        lambda: ops.where(
            ops.reshape(factors.exact_rows(), ops.shape(logits)),
            factored_log_z,
            backend.cumulative_logsumexp(logits, axis=-1),
        ),
    )
    mean = decayed_prefix(log_z, values, chunk_size, levels=2, item_logits=logits, factors=factors)
    return leading(mean, length), leading(log_z, length)


def _global(logits, values, chunk_size, form):
    """Global causal mean of `[B, H, T]` logits and `[B, H, T, D]` values, in the `form` given (or chosen)."""
    shape = ops.shape(values)
    length, depth = (
        static_size(values, 2),
        static_size(values, 3),
    )  # static where known, so pads and slices can be left out
    if form is None:  # under XLA or on a GPU, the fewest kernels; elsewhere the least arithmetic
        form = "direct" if isinstance(length, int) and backend.compiled_or_on_gpu() else "factored"
    # The rows counted where they are known: a `-1` beside a length of 0 is ambiguous off TensorFlow.
    rows = shape[0] * shape[1] if isinstance(shape[0], int) and isinstance(shape[1], int) else -1
    flat_logits, flat_values = ops.reshape(logits, [rows, length]), ops.reshape(values, [rows, length, depth])
    if form == "direct":
        mean, log_z = direct_softmax_mean(flat_logits, flat_values, chunk_size)
    else:
        mean, log_z = _global_chunked(flat_logits, flat_values, chunk_size)
    return ops.reshape(mean, shape), ops.reshape(log_z, shape[:3])


def _global_with_document_starts(logits, values, document_starts, initial_state, chunk_size):
    """Global mean where documents start at `document_starts [B, T]`; returns `(mean, log_z, state)`.

    Inside a chunk, a `C x C` product over the keys of the row's own
    document. Between chunks, each chunk's last-document statistics are
    merged by a `gated_scan` that restarts at every chunk with a reset; a
    row reads the state before its chunk only if its document was open
    then. Every exponent is still `<= 0`.
    """
    b, h, length, depth = (ops.shape(values)[k] for k in range(4))
    lz0, mean0 = (ops.cast(t, values.dtype) for t in initial_state)
    logits, values = pad_time(logits, values, chunk_size)
    l = ops.reshape(logits, [b, h, -1, chunk_size])  # [B, H, K, C]
    v = ops.reshape(values, [b, h, -1, chunk_size, depth])
    seg = ops.reshape(document_index(document_starts, chunk_size), [b, 1, -1, chunk_size])  # [B, 1, K, C]
    causal = ops.arange(chunk_size, dtype="int32")[None, :] <= ops.arange(chunk_size, dtype="int32")[:, None]
    visible = ops.logical_and(causal, ops.equal(seg[..., :, None], seg[..., None, :]))
    scores = ops.where(visible, l[..., None, :], UNSEEN_LOGIT)  # [B, H, K, C, C]
    log_z = ops.logsumexp(scores, axis=-1)
    mean = backend.matmul(ops.exp(scores - log_z[..., None]), v)

    last = seg[..., -1]  # each chunk's last document; before the first chunk, the initial state's (0)
    before_last = ops.pad(last, [[0, 0], [0, 0], [1, 0]])[..., :-1]
    gates = ops.concatenate([ops.zeros_like(last[..., :1], "bool"), ops.equal(last, before_last)], axis=2)
    gates = ops.broadcast_to(gates, [b, h, ops.shape(gates)[2]])
    after_lz, after_mean = gated_scan(
        gates,
        (
            ops.concatenate([lz0[:, :, None], log_z[..., -1]], 2),
            ops.concatenate([mean0[:, :, None], mean[..., -1, :]], 2),
        ),
        lambda earlier, later: merge_means([earlier, later]),
        axis=2,
    )
    carried = ops.equal(seg, before_last[..., None])  # [B, 1, K, C]
    previous = (ops.where(carried, after_lz[:, :, :-1, None], NEG_INF), after_mean[:, :, :-1, None, :])
    log_z, mean = merge_means([previous, (log_z, mean)])
    mean = ops.reshape(mean, [b, h, -1, depth])[:, :, :length]
    log_z = ops.reshape(log_z, [b, h, -1])[:, :, :length]
    return mean, log_z, (after_lz[:, :, -1], after_mean[:, :, -1])


@accepts_renamed_arguments
def causal_softmax_mean(
    logits,
    values,
    window=None,
    mask=None,
    initial_state=None,
    chunk_size=SOFTMAX_MEAN_CHUNK_SIZE,
    document_starts=None,
    form=None,
):
    """Causal (windowed) softmax-weighted mean, parallel over time.

    Args:
        logits: float tensor `[B, H, T]`. Key-only logits, any range.
        values: float tensor `[B, H, T, D]`.
        window: `None` (every earlier position) or a positive int, the number
            of most recent positions each row sees (itself included).
        mask: optional bool `[B, T]`, False at padding: a padded position adds
            nothing to any later row (its own row is left finite, not
            meaningful). A window's state ends at the last real position:
            right padding is not part of the sequence.
        initial_state: optional state of the positions before these, as from
            `empty_softmax_mean_state()` or a previous call (prefill then continue).
        chunk_size: int `C`, positions per matrix-product chunk.
        document_starts: optional bool `[B, T]`, True where a new document starts:
            from there on nothing before it (the initial state included) is
            seen, and the returned state holds the last document alone.
            Windows longer than `C` then take banded chunks of the window's
            length (cost growing with the window).
        form: the global mean's form, both exact: `"factored"` (each chunk's
            weights as a product of row and key factors, exponentials where a
            logit rises too far: the least arithmetic), `"direct"` (each
            chunk's weights as exponentials, `direct_softmax_mean`: the fewest
            operations, for XLA and GPUs; the length must be known at
            tracing), or None (the default: `"direct"` under XLA or with a GPU,
            else `"factored"`).

    Returns:
        `(mean, log_z, state)`: `mean [B, H, T, D]` in the accumulator dtype
        (float32 unless the values are float64), `log_z [B, H, T]`, and the
        state after the last position, to continue from.
    """
    _check_window(window)
    check_choice("form", form, MEAN_FORMS)
    if form == "direct" and logits.shape[-1] is None:
        raise ValueError(f"form='direct' needs a length known at tracing. Received: logits of shape {logits.shape}")
    end = real_extent(mask, ops.shape(logits)[-1])
    logits, values = _prepare(logits, values, mask)
    if document_starts is not None:
        return _with_document_starts(logits, values, window, initial_state, chunk_size, document_starts, end)
    if window is not None and initial_state is not None:
        # The ring buffer holds the `window` positions before these.
        buf_l, buf_v = initial_state
        logits = ops.concatenate([ops.cast(buf_l, logits.dtype), logits], axis=-1)
        values = ops.concatenate([ops.cast(buf_v, values.dtype), values], axis=-2)
    if window is None:
        mean, log_z = _global(logits, values, chunk_size, form)
    else:
        mean, log_z = windowed_mean(logits, values, window, chunk_size)

    if window is not None:
        if initial_state is None:
            b, h, _, d = (ops.shape(values)[k] for k in range(4))
            empty_l, empty_v = empty_softmax_mean_state(b, h, d, window, values.dtype)
            logits = ops.concatenate([empty_l, logits], axis=-1)
            values = ops.concatenate([empty_v, values], axis=-2)
        else:
            mean, log_z = mean[:, :, window:], log_z[:, :, window:]
        return mean, log_z, (window_after(logits, end, window, axis=2), window_after(values, end, window, axis=2))

    if initial_state is None:
        b, h, _, d = (ops.shape(values)[k] for k in range(4))
        initial_state = empty_softmax_mean_state(b, h, d, None, values.dtype)
    else:
        # Merge the running state of earlier positions into every row.
        lz0 = ops.cast(initial_state[0], log_z.dtype)[..., None]
        mean0 = ops.cast(initial_state[1], mean.dtype)[:, :, None, :]
        merged = logaddexp(lz0, log_z)
        mean = ops.exp(lz0 - merged)[..., None] * mean0 + ops.exp(log_z - merged)[..., None] * mean
        log_z = merged
        initial_state = (lz0[..., 0], mean0[:, :, 0])
    # The last row's statistics, or the initial state when T = 0 (only the last row is copied).
    state = (
        ops.concatenate([initial_state[0][..., None], log_z[..., -1:]], axis=-1)[..., -1],
        ops.concatenate([initial_state[1][:, :, None], mean[:, :, -1:]], axis=2)[:, :, -1],
    )
    return mean, log_z, state


def _with_document_starts(logits, values, window, initial_state, chunk_size, document_starts, end):
    """`causal_softmax_mean` on prepared inputs where documents start at `document_starts`."""
    b, h, d = ops.shape(values)[0], ops.shape(values)[1], ops.shape(values)[3]
    if initial_state is None:
        initial_state = empty_softmax_mean_state(b, h, d, window, values.dtype)
    if window is None:
        return _global_with_document_starts(logits, values, document_starts, initial_state, chunk_size)
    # The ring buffer first, as the initial state's document (no reset in it).
    logits = ops.concatenate([ops.cast(initial_state[0], logits.dtype), logits], axis=-1)
    values = ops.concatenate([ops.cast(initial_state[1], values.dtype), values], axis=-2)
    document_starts = ops.concatenate([ops.zeros([b, window], "bool"), ops.cast(document_starts, "bool")], axis=1)
    mean, log_z = banded_mean(logits, values, window, max(window, chunk_size), document_starts)
    # The state keeps the last document's positions alone.
    seg = document_index(document_starts)
    end = ops.broadcast_to(end, [b])
    last = gather_rows(seg, (end + window - 1)[:, None], 1)[:, 0]
    own = ops.equal(seg, last[:, None])[:, None]  # [B, 1, window + T]
    logits = ops.where(own, logits, NEG_INF)
    values = ops.where(own[..., None], values, 0.0)
    state = (window_after(logits, end, window, axis=2), window_after(values, end, window, axis=2))
    return mean[:, :, window:], log_z[:, :, window:], state


def causal_softmax_mean_step(state, logit, value, window=None, mask=None):
    """One decoding step of `causal_softmax_mean`.

    Args:
        state: the state from `empty_softmax_mean_state()`, `causal_softmax_mean` or a
            previous step.
        logit: float `[B, H]`, the new position's logit.
        value: float `[B, H, D]`, its value.
        window: as in `causal_softmax_mean`; must match the state.
        mask: optional bool `[B]`; False leaves a global state unchanged and
            pushes an empty slot into a window.

    Returns:
        `(mean [B, H, D], log_z [B, H], new_state)`, equal to the last row of
        `causal_softmax_mean` over all positions so far.
    """
    _check_window(window)
    logit, value = _prepare(logit[..., None], value[:, :, None, :], None if mask is None else mask[:, None])
    logit, value = logit[..., 0], value[:, :, 0]
    if window is None:
        log_z, mean = state
        new_log_z = logaddexp(log_z, logit)
        # Online mean: the weight exp(l - L) is in [0, 1], so it never overflows.
        new_mean = mean + ops.exp(logit - new_log_z)[..., None] * (value - mean)
        if mask is not None:
            keep = ops.cast(mask, "bool")[:, None]
            new_log_z = ops.where(keep, new_log_z, log_z)
            new_mean = ops.where(keep[..., None], new_mean, mean)
        return new_mean, new_log_z, (new_log_z, new_mean)
    buf_l, buf_v = state
    buf_l = ops.concatenate([buf_l[:, :, 1:], logit[..., None]], axis=-1)
    buf_v = ops.concatenate([buf_v[:, :, 1:], value[:, :, None]], axis=2)
    log_z = ops.logsumexp(buf_l, axis=-1)
    mean = ops.einsum("bhw,bhwd->bhd", ops.exp(buf_l - log_z[..., None]), buf_v)
    return mean, log_z, (buf_l, buf_v)
