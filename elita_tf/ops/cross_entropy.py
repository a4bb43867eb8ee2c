"""Softmax cross-entropy of a linear output layer, a chunk of tokens at a time (docs/math.md §10).

For final hidden states `h [N, d]`, an output kernel `W [d, V]`, an optional
bias `b [V]`, a scale `s` and labels `y [N]`:

    z_n    = s (h_n W + b)                   the logits of token n, [V]
    loss_n = logsumexp(z_n) - z_n[y_n]

Computed plainly, `z` is `[B, T, V]` floats (655 MB at B = 128, T = 256,
V = 5000), kept for the backward pass, with its softmax and gradient beside
it. Here the `N` tokens are taken `C` at a time, and no more than one
chunk's `[C, V]` logits and softmax exist at once. The gradients are

    dz_n = g_n (softmax(z_n) - onehot(y_n))
    dh_n = s dz_n Wᵀ,   dW = s Σ_n h_nᵀ dz_n,   db = s Σ_n dz_n

Three things keep the passes over a chunk's `[C, V]` values few:
- the bias rides in the matrix product: rows `[s h_n, s]` times `[W; b]`
  give `z` and, transposed against the softmax, `dW` and `db` together;
- the loss is `-log softmax(z_n)[y_n]`, read from the softmax (one fused
  op) where that probability is a normal float, so the forward pass takes
  no separate max, exponential or sum over the logits;
- the one-hot part of `dz` never touches a `[C, V]` array: it is the
  column `W[:, y_n]` for `dh_n` and a sum of rows per label for `dW`, `db`.

Per-token losses (`reduction="none"`) keep only the losses; the backward
pass recomputes each chunk's logits, one more `[N, d] x [d, V]` product, and
is exact for any upstream gradient. Their weighted sum (`reduction="sum"`,
training) has one number as its upstream gradient, so the forward pass forms
the gradients for weights `g_n = w_n` while it holds each chunk's softmax,
and the backward pass scales them by that number: three `[N, d] x [d, V]`
products in all, as many as with the full logits, and no choice to make at
run time. All arithmetic is float32 (float64 stays float64) whatever the
input dtype. The chunks are a scan (`elita_tf.backend.scan`): a
`tf.while_loop` with one chunk in flight on TensorFlow, `lax.scan` on JAX.
"""

import keras
import numpy as np
from keras import ops

from elita_tf import backend
from elita_tf.checks import check_choice, check_integer
from elita_tf.ops.utils.dtypes import accumulator_dtype, dtype_of
from elita_tf.ops.utils.positions import gather_rows
from elita_tf.ops.utils.token_ids import check_token_ids

CROSS_ENTROPY_CHUNK_SIZE = 512
_IGNORING_A_POSITION = "To leave a position out of the loss, give it a sample_weight of 0 (not a label of -100)."


def _token_loss(logits, probs, labels):
    """`logsumexp(z_n) - z_n[y_n]` of one chunk `[C]`, read from its softmax `probs`.

    The loss is `-log softmax(z_n)[y_n]`: one gather, and accurate to
    round-off while that probability is a normal float. A row where it falls
    below the square root of the smallest normal (a loss above 43.7 in
    float32) takes `max z_n - log max softmax(z_n) - z_n[y_n]` instead, exact
    at any size since the largest probability is at least `1/V`. The rows
    choose between the two (`branch_or_select`: under XLA the maxima fuse
    with the softmax's own).
    """
    label_probs = gather_rows(probs, labels[:, None], 1)[:, 0]
    tiny = ops.convert_to_tensor(float(np.sqrt(np.finfo(dtype_of(probs)).tiny)), dtype_of(probs))

    def by_row():
        label_logits = gather_rows(logits, labels[:, None], 1)[:, 0]
        from_the_largest = ops.max(logits, axis=-1) - ops.log(ops.max(probs, axis=-1)) - label_logits
        return ops.where(label_probs >= tiny, -ops.log(backend.maximum(label_probs, tiny)), from_the_largest)

    return backend.branch_or_select(ops.all(label_probs >= tiny), lambda: -ops.log(label_probs), by_row)


def _chunked_loss(hidden, kernel, bias, labels, valid, weights, scale):
    """Per-token loss `[K, C]` of hidden `[K, C, d]` and labels `[K, C]`, with its custom gradient.

    `valid [K, C]` is 1 on real tokens, 0 on the chunks' padding. With `weights [K, C]` (zero on the
    padding) the result is instead the scalar `Σ weights * loss`, whose gradients the forward pass forms.
    Every tensor is an argument of the custom gradient (JAX lets it close over none); only the first three
    get gradients.
    """
    summed = weights is not None
    width, vocab_size = kernel.shape
    options_given = ([weights] if summed else []) + ([] if scale is None else [scale])

    def loss_fn(hidden, kernel, bias, labels, valid, *options):
        options = list(options)
        weights = options.pop(0) if summed else None
        scale = options.pop(0) if options else None
        # z = s (h W + b) as one product: rows [s h, s] times the table [W; b]. A padded token's row is
        # all zeros, so it adds nothing to the table's gradient.
        rows = ops.concatenate([hidden, valid[..., None]], axis=-1)  # [K, C, d + 1]
        rows = rows if scale is None else rows * scale
        table = ops.concatenate([kernel, bias[None]], axis=0)  # [d + 1, V]

        def chunk_softmax(chunk_rows):
            logits = backend.matmul(chunk_rows, table)  # [C, V]
            return logits, ops.softmax(logits, axis=-1)

        def softmax_shares(probs, weighted_rows, d_table):
            """The softmax's share of the gradients for weights `g`: `softmax Wᵀ` for the hidden states,
            `(g rows)ᵀ softmax` added to the table's. The one-hot part of `softmax - onehot(y)` comes after."""
            return backend.matmul(probs, kernel, transpose_b=True), d_table + backend.matmul(
                weighted_rows, probs, transpose_a=True
            )

        # The gradients for weights `g [K, C]` from the softmax's shares, the one-hot part subtracted:
        # `dh_n = s g_n (softmax(z_n) Wᵀ - W[:, y_n]ᵀ)` and the table's
        # `Σ_n g_n rows_nᵀ (softmax(z_n) - onehot(y_n))`, whose one-hot part is a sum of `g_n rows_n`
        # per label: `[N, d + 1]` work, not `[N, V]`.
        def hidden_gradient(weights, soft_hidden):
            d_hidden = (soft_hidden - ops.take(ops.transpose(kernel), labels, axis=0)) * weights[..., None]
            return d_hidden if scale is None else d_hidden * scale

        def table_gradient(weights, soft_table):
            weighted = ops.reshape(rows * weights[..., None], [-1, width + 1])
            one_hot_part = backend.segment_sum(weighted, ops.reshape(labels, [-1]), vocab_size)  # [V, d + 1]
            return soft_table - ops.transpose(one_hot_part)

        if summed:  # the softmax's shares for g = weights, while each chunk's softmax is here

            def forward(d_table, chunk):
                chunk_rows, weighted_rows, chunk_labels = chunk
                logits, probs = chunk_softmax(chunk_rows)
                d_hidden, d_table = softmax_shares(probs, weighted_rows, d_table)
                return d_table, (_token_loss(logits, probs, chunk_labels), d_hidden)

            # Padded rows are zeros already: weights that are just `valid` change nothing.
            weighted_rows = rows if weights is valid else rows * weights[..., None]
            soft_table, (losses, soft_hidden) = backend.scan(forward, ops.zeros_like(table), (rows, weighted_rows, labels))
        else:

            def forward(nothing, chunk):
                logits, probs = chunk_softmax(chunk[0])
                return nothing, _token_loss(logits, probs, chunk[1])

            _, losses = backend.scan(forward, (), (rows, labels))

        def recomputed(upstream):
            """Per-token upstream gradients: each chunk's softmax formed again."""

            def backward(d_table, chunk):
                chunk_rows, weighted_rows = chunk
                d_hidden, d_table = softmax_shares(chunk_softmax(chunk_rows)[1], weighted_rows, d_table)
                return d_table, d_hidden

            shares = backend.scan(backward, ops.zeros_like(table), (rows, rows * upstream[..., None]))
            return hidden_gradient(upstream, shares[1]), table_gradient(upstream, shares[0])

        def grad(upstream):
            with keras.name_scope("chunked_cross_entropy_gradient"):
                if summed:  # the sum's upstream gradient is one number: the weighted shares scaled by it, exactly
                    d_hidden = upstream * hidden_gradient(weights, soft_hidden)
                    d_table = upstream * table_gradient(weights, soft_table)
                else:
                    d_hidden, d_table = recomputed(upstream)
                return (d_hidden, d_table[:width], d_table[width]) + (None,) * (2 + len(options_given))

        return (ops.sum(losses * weights) if summed else losses), grad

    with keras.name_scope("chunked_cross_entropy"):
        return backend.custom_gradient(loss_fn)(hidden, kernel, bias, labels, valid, *options_given)


def chunked_cross_entropy(
    hidden,
    kernel,
    labels,
    bias=None,
    scale=1.0,
    chunk_size=CROSS_ENTROPY_CHUNK_SIZE,
    sample_weight=None,
    reduction="none",
):
    """Softmax cross-entropy of `s (hidden @ kernel + bias)`, per token or summed, without all the logits at once.

    Args:
        hidden: float `[..., d]`, the final hidden states.
        kernel: float `[d, V]`, the output layer (a tied embedding's transpose).
        labels: int `[...]`, the target ids in `[0, V)`. An id outside is an
            error where the labels' values are known (eagerly; in a TensorFlow
            graph, an assertion), and a NaN loss where no check runs (XLA,
            `jax.jit`). Another library's "ignore" label (-100, -1) is not one
            here: a `sample_weight` of 0 leaves a position out.
        bias: optional float `[V]`.
        scale: float. Multiplies the logits (a tied head's `1/sqrt(d)`). Defaults to `1.0`.
        chunk_size: int. Tokens per chunk `C`: the peak holds `C x V` logits.
            Defaults to `512`.
        sample_weight: optional float `[...]` like `labels`: each token's loss
            is multiplied by it.
        reduction: `"none"` (per-token losses) or `"sum"` (their sum). The
            sum is the training form: its forward pass also forms the
            gradients while each chunk's logits are at hand, so the backward
            pass needs no second pass over the logits (one matrix product
            fewer), and nothing is decided at run time. Per-token losses
            recompute the logits in the backward pass, exact for any
            upstream gradient. Defaults to `"none"`.

    Returns:
        float32 (float64 for float64 inputs) `[...]` losses `logsumexp(z) - z[label]`,
        or their scalar sum, with gradients to `hidden`, `kernel` and `bias` in their own dtypes.

    Example:
    >>> hidden, kernel = keras.random.normal([2, 8, 16]), keras.random.normal([16, 100])
    >>> tuple(chunked_cross_entropy(hidden, kernel, keras.ops.zeros([2, 8], "int32"), chunk_size=4).shape)
    (2, 8)
    >>> tuple(chunked_cross_entropy(hidden, kernel, keras.ops.zeros([2, 8], "int32"), reduction="sum").shape)
    ()
    """
    check_integer("chunk_size", chunk_size)
    check_choice("reduction", reduction, ("none", "sum"))
    dtype = accumulator_dtype(hidden.dtype)
    width, vocab_size = kernel.shape[0], kernel.shape[-1]
    if hidden.shape[-1] != width:
        raise ValueError(
            f"`hidden`'s last axis must be the kernel's input width {width}. Received: hidden.shape={tuple(hidden.shape)}"
        )
    out_shape = ops.shape(labels)
    if sample_weight is not None:
        sample_weight = ops.broadcast_to(ops.cast(sample_weight, dtype), out_shape)
    hidden = ops.reshape(ops.cast(hidden, dtype), [-1, width])
    labels, in_range = check_token_ids(
        ops.cast(labels, "int32"), vocab_size, "labels", "Labels", _IGNORING_A_POSITION
    )
    # Where no check ran, an id out of range is read as 0, and its loss is NaN.
    in_range = ops.reshape(in_range, [-1])
    labels = ops.where(in_range, ops.reshape(labels, [-1]), 0)
    count = ops.shape(labels)[0]
    pad = (-count) % chunk_size  # padded tokens get a zero upstream gradient: they add nothing

    def chunks(x):
        """`x [N, ...]` padded with zeros to whole chunks: `[K, C, ...]`."""
        x = ops.pad(x, [[0, pad]] + [[0, 0]] * (len(x.shape) - 1))
        return ops.reshape(x, [-1, chunk_size, *x.shape[1:]])

    valid = chunks(ops.ones_like(labels, dtype=dtype))
    # Read variables here: the custom gradient is taken with respect to these tensors.
    bias = ops.zeros([vocab_size], dtype) if bias is None else ops.cast(bias, dtype)
    if ops.is_tensor(scale):
        scale = ops.cast(scale, dtype)
    else:  # a Python float stays exact; 1 costs nothing
        scale = None if scale == 1 else ops.convert_to_tensor(scale, dtype)
    kernel = ops.cast(kernel, dtype)
    hidden, labels = chunks(hidden), chunks(labels)
    nan = ops.convert_to_tensor(float("nan"), dtype)
    if reduction == "sum":
        weights = valid if sample_weight is None else valid * chunks(ops.reshape(sample_weight, [-1]))
        return ops.where(ops.all(in_range), _chunked_loss(hidden, kernel, bias, labels, valid, weights, scale), nan)
    losses = _chunked_loss(hidden, kernel, bias, labels, valid, None, scale)
    losses = ops.where(in_range, ops.reshape(losses, [-1])[:count], nan)
    losses = ops.reshape(losses, out_shape)
    return losses if sample_weight is None else losses * sample_weight
