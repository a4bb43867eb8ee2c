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
input dtype.
"""

import numpy as np
import tensorflow as tf

from elita_tf.ops.utils.dtypes import accumulator_dtype
from elita_tf.backend import branch_or_select

CROSS_ENTROPY_CHUNK_SIZE = 512


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
    label_probs = tf.gather(probs, labels, axis=1, batch_dims=1)
    tiny = float(np.sqrt(np.finfo(probs.dtype.as_numpy_dtype).tiny))

    def by_row():
        label_logits = tf.gather(logits, labels, axis=1, batch_dims=1)
        from_the_largest = tf.reduce_max(logits, axis=-1) - tf.math.log(tf.reduce_max(probs, axis=-1)) - label_logits
        return tf.where(label_probs >= tiny, -tf.math.log(tf.maximum(label_probs, tiny)), from_the_largest)

    return branch_or_select(tf.reduce_all(label_probs >= tiny), lambda: -tf.math.log(label_probs), by_row)


def _chunked_loss(hidden, kernel, bias, labels, valid, weights, scale, parallel_iterations):
    """Per-token loss `[K, C]` of hidden `[K, C, d]` and labels `[K, C]`, with its custom gradient.

    `valid [K, C]` is 1 on real tokens, 0 on the chunks' padding. With `weights [K, C]` (zero on the
    padding) the result is instead the scalar `Σ weights * loss`, whose gradients the forward pass forms.
    """
    summed = weights is not None
    width, vocab_size = kernel.shape

    def loop(body, arrays, accumulators=()):
        num_chunks = tf.shape(hidden)[0]
        return tf.while_loop(
            lambda k, *_: k < num_chunks, body, [0, *arrays, *accumulators], parallel_iterations=parallel_iterations
        )[1:]

    def array(element_shape):
        return tf.TensorArray(hidden.dtype, size=tf.shape(hidden)[0], element_shape=element_shape)

    @tf.custom_gradient
    def loss_fn(hidden, kernel, bias):
        # z = s (h W + b) as one product: rows [s h, s] times the table [W; b]. A padded token's row is
        # all zeros, so it adds nothing to the table's gradient.
        rows = tf.concat([hidden, valid[..., None]], axis=-1)  # [K, C, d + 1]
        rows = rows if scale is None else rows * scale
        table = tf.concat([kernel, bias[None]], axis=0)  # [d + 1, V]

        def chunk_softmax(k):
            logits = tf.matmul(rows[k], table)  # [C, V]
            return logits, tf.nn.softmax(logits)

        def softmax_step(k, weighted_rows, d_hidden, d_table):
            """Chunk `k`'s logits and softmax, and the softmax's share of the gradients for weights `g`.

            The share is `softmax Wᵀ` for the hidden states and `(g rows)ᵀ softmax` for the
            table; the one-hot part of `softmax - onehot(y)` is added after the loop.
            """
            logits, probs = chunk_softmax(k)
            if d_hidden is not None:
                d_hidden = d_hidden.write(k, tf.matmul(probs, kernel, transpose_b=True))
            return logits, probs, d_hidden, d_table + tf.matmul(weighted_rows[k], probs, transpose_a=True)

        # The gradients for weights `g [K, C]` from the softmax's shares, the one-hot part subtracted:
        # `dh_n = s g_n (softmax(z_n) Wᵀ - W[:, y_n]ᵀ)` and the table's
        # `Σ_n g_n rows_nᵀ (softmax(z_n) - onehot(y_n))`, whose one-hot part is a sum of `g_n rows_n`
        # per label: `[N, d + 1]` work, not `[N, V]`.
        def hidden_gradient(weights, soft_hidden):
            d_hidden = (soft_hidden - tf.gather(tf.transpose(kernel), labels)) * weights[..., None]
            return d_hidden if scale is None else d_hidden * scale

        def table_gradient(weights, soft_table):
            weighted = tf.reshape(rows * weights[..., None], [-1, width + 1])
            one_hot_part = tf.math.unsorted_segment_sum(weighted, tf.reshape(labels, [-1]), vocab_size)  # [V, d + 1]
            return soft_table - tf.transpose(one_hot_part)

        if summed:  # padded rows are zeros already: weights that are just `valid` change nothing
            weighted_rows = rows if weights is valid else rows * weights[..., None]

        def forward(k, losses, *gradients):
            if summed:  # the softmax's shares for g = weights, while the softmax is here
                logits, probs, *gradients = softmax_step(k, weighted_rows, *gradients)
            else:
                logits, probs = chunk_softmax(k)
            return [k + 1, losses.write(k, _token_loss(logits, probs, labels[k])), *gradients]

        arrays, accumulators = [array(labels.shape[1:])], []
        if summed:
            arrays.append(array(hidden.shape[1:]))
            accumulators = [tf.zeros_like(table)]
        losses, *weighted_shares = loop(forward, arrays, accumulators)

        def recomputed(upstream, with_hidden):
            weighted_rows = rows * upstream[..., None]

            def backward(k, *gradients):
                gradients = gradients if with_hidden else (None, *gradients)
                _, _, d_hidden, d_table = softmax_step(k, weighted_rows, *gradients)
                return [k + 1, d_table] if d_hidden is None else [k + 1, d_hidden, d_table]

            shares = loop(backward, [array(hidden.shape[1:])] if with_hidden else [], [tf.zeros_like(table)])
            d_table = table_gradient(upstream, shares[-1])
            return (hidden_gradient(upstream, shares[0].stack()), d_table) if with_hidden else d_table

        def gradients(upstream):
            if not summed:
                return recomputed(upstream, with_hidden=True)
            # The sum's upstream gradient is one number: the weighted shares scaled by it, exactly.
            soft_hidden, soft_table = weighted_shares
            return (
                upstream * hidden_gradient(weights, soft_hidden.stack()),
                upstream * table_gradient(weights, soft_table),
            )

        def grad(upstream):
            with tf.name_scope("chunked_cross_entropy_gradient"):
                d_hidden, d_table = gradients(upstream)
                return d_hidden, d_table[:width], d_table[width]

        losses = losses.stack()
        return (tf.reduce_sum(losses * weights) if summed else losses), grad

    with tf.name_scope("chunked_cross_entropy"):
        return loss_fn(hidden, kernel, bias)


def chunked_cross_entropy(
    hidden,
    kernel,
    labels,
    bias=None,
    scale=1.0,
    chunk_size=CROSS_ENTROPY_CHUNK_SIZE,
    sample_weight=None,
    reduction="none",
    parallel_iterations=1,
):
    """Softmax cross-entropy of `s (hidden @ kernel + bias)`, per token or summed, without all the logits at once.

    Args:
        hidden: float `[..., d]`, the final hidden states.
        kernel: float `[d, V]`, the output layer (a tied embedding's transpose).
        labels: int `[...]`, the target ids in `[0, V)`.
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
        parallel_iterations: int. Chunks in flight at once. Defaults to `1`.

    Returns:
        float32 (float64 for float64 inputs) `[...]` losses `logsumexp(z) - z[label]`,
        or their scalar sum, with gradients to `hidden`, `kernel` and `bias` in their own dtypes.

    Example:
    >>> hidden, kernel = tf.random.normal([2, 8, 16]), tf.random.normal([16, 100])
    >>> chunked_cross_entropy(hidden, kernel, tf.zeros([2, 8], tf.int32), chunk_size=4).shape
    TensorShape([2, 8])
    >>> chunked_cross_entropy(hidden, kernel, tf.zeros([2, 8], tf.int32), reduction="sum").shape
    TensorShape([])
    """
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"`chunk_size` must be a positive integer. Received: chunk_size={chunk_size}")
    if reduction not in ("none", "sum"):
        raise ValueError(f'`reduction` must be "none" or "sum". Received: reduction={reduction!r}')
    dtype = accumulator_dtype(hidden.dtype)
    width, vocab_size = kernel.shape[0], kernel.shape[-1]
    if hidden.shape[-1] != width:
        raise ValueError(
            f"`hidden`'s last axis must be the kernel's input width {width}. Received: hidden.shape={hidden.shape}"
        )
    out_shape = tf.shape(labels)
    if sample_weight is not None:
        sample_weight = tf.broadcast_to(tf.cast(sample_weight, dtype), out_shape)
    hidden = tf.reshape(tf.cast(hidden, dtype), [-1, width])
    labels = tf.reshape(tf.cast(labels, tf.int32), [-1])
    count = tf.shape(labels)[0]
    num_chunks = (count + chunk_size - 1) // chunk_size
    pad = num_chunks * chunk_size - count  # padded tokens get a zero upstream gradient: they add nothing
    hidden = tf.reshape(tf.pad(hidden, [[0, pad], [0, 0]]), [-1, chunk_size, width])
    valid = tf.reshape(tf.sequence_mask(count, num_chunks * chunk_size, dtype), [-1, chunk_size])
    labels = tf.reshape(tf.pad(labels, [[0, pad]]), [-1, chunk_size])
    # Read variables here: the custom gradient is taken with respect to these tensors.
    bias = tf.zeros([vocab_size], dtype) if bias is None else tf.convert_to_tensor(tf.cast(bias, dtype))
    if tf.is_tensor(scale):
        scale = tf.cast(scale, dtype)
    else:  # a Python float stays exact; 1 costs nothing
        scale = None if scale == 1 else tf.constant(scale, dtype)
    kernel = tf.convert_to_tensor(tf.cast(kernel, dtype))
    if reduction == "sum":
        weights = valid
        if sample_weight is not None:
            weights = valid * tf.reshape(tf.pad(tf.reshape(sample_weight, [-1]), [[0, pad]]), [-1, chunk_size])
        return _chunked_loss(hidden, kernel, bias, labels, valid, weights, scale, parallel_iterations)
    losses = _chunked_loss(hidden, kernel, bias, labels, valid, None, scale, parallel_iterations)
    losses = tf.reshape(tf.reshape(losses, [-1])[:count], out_shape)
    return losses if sample_weight is None else losses * sample_weight
