"""Helpers shared by the ops and the layers."""

import tensorflow as tf

# A finite stand-in for log(0): exp() of it is exactly 0, and unlike -inf it
# never makes `-inf - -inf = nan` in a forward or backward pass.
NEG_INF = -1e30


def accumulator_dtype(dtype):
    """float64 stays float64, anything else is accumulated in float32."""
    dtype = tf.as_dtype(dtype)
    return tf.float64 if dtype == tf.float64 else tf.float32


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


def _in_xla_or_on_gpu():
    """Whether the graph being traced is compiled by XLA, or a GPU is visible to TensorFlow."""
    try:  # TensorFlow's own test, as `tf.function(jit_compile=True)` sets it while tracing
        from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext

        if GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
            return True
    except ImportError:  # pragma: no cover - a TensorFlow without it still selects on a GPU
        pass
    return bool(tf.config.list_logical_devices("GPU"))


def branch_or_select(usual, fast, general):
    """`fast()` where the scalar bool `usual` holds, else `general()`, which is right in every case.

    A choice the data makes, made the cheapest way for where it runs:
    - on a CPU without XLA, a `tf.cond`: the general form, an extra pass, runs only when needed;
    - traced for XLA, or with a GPU visible, `general()` alone, no branch. A branch copies its
      predicate to the host, and under XLA ends the GPU's command buffer there: on a GPU that costs
      more than the extra pass, which XLA fuses into its neighbours.
    """
    if _in_xla_or_on_gpu():
        return general()
    return tf.cond(usual, fast, general)


def contain_nonfinite(compute, inputs, padding_mask=None):
    """Runs a causal token mixer so that a NaN or Inf input cannot travel back in time.

    Chunked kernels contract whole chunks with matrix products, where a
    weight of exactly zero still meets every value of the chunk: `0 * NaN`
    is NaN, so one bad position would spoil the earlier rows of its chunk
    (and a padded position holding NaN would spoil every row). Here the
    mixer never sees a bad value:

    - a position holding NaN or Inf is replaced by zeros for the
      computation (a select, not a product). At padding (False in
      `padding_mask`) that is all: the mixer already keeps a padded
      position out of every other row, so it reaches no output;
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
    finite = tf.reduce_all(tf.math.is_finite(inputs), axis=-1)  # [B, T]
    # Without a bad value the inputs go through as they are on a CPU: no copy, which the mixer's projections
    # would keep for the backward pass beside the norm's output that it equals.
    clean = branch_or_select(
        tf.reduce_all(finite),
        lambda: tf.identity(inputs),
        lambda: tf.where(finite[..., None], inputs, tf.zeros([], inputs.dtype)),
    )
    result = compute(clean)
    bad = tf.logical_not(finite)
    if padding_mask is not None:
        bad &= tf.cast(padding_mask, tf.bool)  # real positions that hold NaN or Inf
    poisoned = tf.cumsum(tf.cast(bad, tf.int32), axis=1) > 0  # [B, T]: rows at or after one

    def poison_rows(x):
        mask = tf.reshape(poisoned, tf.concat([tf.shape(poisoned), tf.ones([x.shape.rank - 2], tf.int32)], 0))
        return tf.where(mask, tf.constant(float("nan"), x.dtype), x)

    if not isinstance(result, tuple):
        return poison_rows(result)
    outputs, cache = result
    any_bad = tf.reduce_any(bad, axis=1)  # [B]

    def poison_state(x):
        if not x.dtype.is_floating or x.shape.rank == 0:
            return x
        mask = tf.reshape(any_bad, tf.concat([tf.shape(any_bad), tf.ones([x.shape.rank - 1], tf.int32)], 0))
        return tf.where(mask, tf.constant(float("nan"), x.dtype), x)

    return poison_rows(outputs), tf.nest.map_structure(poison_state, cache)


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


def outer_product(u, v):
    """`u [..., m]` and `v [..., n]` to `[..., m, n]`, `u_i v_j`, as a batched matrix product.

    On a CPU (oneDNN) this is faster than the broadcast multiply
    `u[..., :, None] * v[..., None, :]`, most where `n` is small and the
    broadcast's inner loop runs over few values: 2.9 against 5.7 ms for
    FeedForward2's `[8192, 64] x [8192, 8]`. Its gradients are matrix-vector
    products.
    Each entry is one product, so on a CPU the result is the broadcast's to
    the bit (checked in float64, float32, float16 and bfloat16); a GPU that
    takes float32 products in TF32 rounds the factors as it does in other
    products.
    """
    return tf.matmul(tf.expand_dims(u, -1), tf.expand_dims(v, -2))


@tf.custom_gradient
def pairwise_product(alpha, beta):
    """`alpha [N, a]` and `beta [N, b]` to their per-row outer product `[N, a, b]`: `alpha_i beta_j`.

    The gradient is two batched matrix-vector products, `dalpha = dP beta`
    and `dbeta = alphaᵀ dP` per row, rather than the broadcast multiplies
    and reductions TensorFlow derives for `alpha[:, :, None] * beta[:, None, :]`:
    each reads the `[N, a, b]` gradient once (about a third less time for
    `FeedForward2`'s backward pass on a CPU).
    """
    product = outer_product(alpha, beta)

    def grad(upstream):
        with tf.name_scope("pairwise_product_gradient"):
            d_alpha = tf.squeeze(tf.matmul(upstream, tf.expand_dims(beta, 2)), 2)
            d_beta = tf.squeeze(tf.matmul(tf.expand_dims(alpha, 1), upstream), 1)
        return d_alpha, d_beta

    return product, grad


def _swish_and_slope(x):
    """`swish(x) = x sigmoid(x)` and its derivative `sigmoid(x) (1 + x (1 - sigmoid(x)))`."""
    s = tf.sigmoid(x)
    y = x * s
    return y, s + y * (1 - s)


def pairwise_projection(alpha, beta, kernel, swish=False, slice_rows=8192):
    """`Σ_ij alpha_i beta_j kernel[i, j, :]` per row: `[N, a]`, `[N, b]`, `[a, b, w]` to `[N, w]`.

    The same as projecting `pairwise_product(alpha, beta)` with `kernel`, but
    the `[N, a, b]` product is not kept for the backward pass: the kernel's
    gradient is `alphaᵀ (beta ⊗ upstream)`, whose `[N, b, w]` factor exists
    only while it is taken. In a model that is `N * a * b` values less memory
    held per layer until the backward pass reaches it. The backward pass forms
    that factor and the product's own gradient `[N, a, b]` one after the
    other. When `N` is known at tracing, both passes take `slice_rows` rows
    at a time, each slice after the previous one (the backward pass forms
    both of a slice's tensors before the next slice's), so that one slice's
    `[rows, a * b]` tensors are alive, not all `N` rows' (64 MiB a layer in
    float32 at the seed configuration).

    With `swish=True`, `alpha` and `beta` are pre-activations and the
    product is of `swish(alpha)` and `swish(beta)`: the backward pass
    recomputes the swish from the pre-activations, one slice at a time, so
    that only the pre-activations are held for it, not both them and the
    activations (what a swish layer followed by this product would keep).
    """
    a, b, width = kernel.shape
    flat_kernel = tf.reshape(kernel, [a * b, width])

    def slices(*tensors):
        rows = tensors[0].shape[0]
        if rows is None or rows <= slice_rows:
            return [tensors]
        whole, rest = divmod(rows, slice_rows)
        sizes = [slice_rows] * whole + ([rest] if rest else [])
        return list(zip(*(tf.split(t, sizes) for t in tensors)))

    def in_turn(parts, step, after=()):
        """`step` on each slice, each after the previous slice's results exist."""
        results = []
        for part in parts:
            with tf.control_dependencies(list(after)):
                result = step(*part)
            results.append(result)
            after = tf.nest.flatten(result)
        return results

    def join(parts):
        return parts[0] if len(parts) == 1 else tf.concat(parts, 0)

    def project_slice(alpha, beta):
        if swish:
            alpha, beta = tf.nn.silu(alpha), tf.nn.silu(beta)
        product = tf.reshape(outer_product(alpha, beta), [-1, a * b])
        return tf.matmul(product, flat_kernel)

    @tf.custom_gradient
    def project(alpha, beta, kernel):
        def grad(upstream):
            with tf.name_scope("pairwise_projection_gradient"):

                def slice_gradients(alpha, beta, upstream):
                    if swish:  # the factors again, and the slopes that take their gradients to the pre-activations
                        (alpha, alpha_slope), (beta, beta_slope) = _swish_and_slope(alpha), _swish_and_slope(beta)
                    beta_upstream = outer_product(beta, upstream)  # [rows, b, w]
                    d_kernel = tf.matmul(alpha, tf.reshape(beta_upstream, [-1, b * width]), transpose_a=True)
                    with tf.control_dependencies([d_kernel]):  # the [rows, a, b] gradient once that factor is used
                        d_product = tf.reshape(tf.matmul(upstream, flat_kernel, transpose_b=True), [-1, a, b])
                    d_alpha = tf.squeeze(tf.matmul(d_product, tf.expand_dims(beta, 2)), 2)
                    d_beta = tf.squeeze(tf.matmul(tf.expand_dims(alpha, 1), d_product), 1)
                    if swish:
                        d_alpha, d_beta = d_alpha * alpha_slope, d_beta * beta_slope
                    return d_kernel, d_alpha, d_beta

                d_kernel, d_alpha, d_beta = zip(*in_turn(slices(alpha, beta, upstream), slice_gradients))
                return join(d_alpha), join(d_beta), tf.reshape(tf.add_n(d_kernel), [a, b, width])

        return join(in_turn(slices(alpha, beta), project_slice)), grad

    return project(alpha, beta, kernel)


def segment_ids(resets, length_multiple=1):
    """Per position, how many resets come at or before it: int32 `[B, T']`, `T'` padded to `length_multiple`.

    `resets` is bool `[B, T]`, True where a new document starts (nothing
    before it is seen from there on). Padding continues the last segment.
    """
    resets = tf.cast(resets, tf.int32)
    return tf.cumsum(pad_axis(resets, 1, (-tf.shape(resets)[1]) % length_multiple), axis=1)


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

    def shift(x, steps, fill):
        paddings = [[0, 0]] * x.shape.rank
        paddings[axis] = [steps, 0]
        return tf.slice(tf.pad(x, paddings, constant_values=fill), tf.zeros_like(tf.shape(x)), tf.shape(x))

    def expand(mask, x):
        return tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([x.shape.rank - mask.shape.rank], tf.int32)], 0))

    def body(steps, gates, *items):
        # Entry k holds the span (k - steps, k]; it takes the span before it unless a barrier is in its own.
        merged = combine(tuple(shift(x, steps, 0) for x in items), items)
        take = gates & (tf.range(size) >= steps)
        items = tuple(tf.where(expand(take, x), m, x) for m, x in zip(merged, items))
        # The first `steps` entries are complete prefixes: whatever their gate, nothing lies before them.
        return (steps * 2, gates & shift(gates, steps, False), *items)

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


def document_positions(length, start=None, resets=None):
    """Each position's index in its sequence, int32 `[B or 1, T]`: `start + t`, restarting at 0 at every reset.

    Args:
        length: scalar `T`.
        start: optional int `[B]`, the index of the first position (a continued sequence).
        resets: optional bool `[B, T]`, True where a new document starts.
    """
    index = tf.range(length)[None, :]
    if start is not None:
        index = index + start[:, None]
    if resets is not None:
        ones = tf.ones_like(resets, tf.int32)
        (count,) = gated_scan(tf.logical_not(resets), (ones,), lambda a, b: (a[0] + b[0],), axis=1)
        index = tf.where(tf.cumsum(tf.cast(resets, tf.int32), axis=1) > 0, count - 1, index)
    return index


def position_after(index, start, end):
    """The index after each row's last real position: `index [B, T]` at `end - 1`, plus 1 (`start` where `end = 0`)."""
    end = tf.broadcast_to(end, tf.shape(start))
    last = tf.gather(pad_axis(index, 1, 1), tf.maximum(end - 1, 0), batch_dims=1)
    return tf.where(end > 0, last + 1, start)
