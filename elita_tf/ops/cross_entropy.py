"""Softmax cross-entropy of a linear output layer, a chunk of tokens at a time (docs/math.md §10).

For final hidden states `h [N, d]`, an output kernel `W [d, V]`, an optional
bias `b [V]`, a scale `s` and labels `y [N]`:

    z_n    = s (h_n W + b)                   the logits of token n, [V]
    loss_n = logsumexp(z_n) - z_n[y_n]

Computed plainly, `z` is `[B, T, V]` floats (655 MB at B = 128, T = 256,
V = 5000), kept for the backward pass, with its softmax and gradient beside
it. Here the `N` tokens are taken `C` at a time. The forward pass keeps only
each token's log-sum-exp; the backward pass recomputes a chunk's logits and
forms its gradient at once,

    dz_n = g_n (softmax(z_n) - onehot(y_n))
    dh_n = s dz_n Wᵀ,   dW = s Σ_n h_nᵀ dz_n,   db = s Σ_n dz_n

so no more than one chunk's `[C, V]` logits exist at a time. The price is
one more `[N, d] x [d, V]` product (the recomputation).

With `gradient_in_forward=True` (training) the forward pass also forms the
gradients for `g_n = 1` while it holds each chunk's logits; the backward pass
multiplies them by `g`, which is exact for `dh` token by token and, for `dW`
and `db`, whenever `g` is one number on every token (a mean loss). That is
three `[N, d] x [d, V]` products in all, as many as with the full logits.
All arithmetic is float32 (float64 stays float64) whatever the input dtype.
"""

import tensorflow as tf

from elita_tf.ops.utils import accumulator_dtype

DEFAULT_CROSS_ENTROPY_CHUNK = 512


def _chunk_logits(hidden, kernel, bias, scale):
    logits = tf.matmul(hidden, kernel) + bias  # [C, V]
    return logits if scale is None else logits * scale


def _logit_gradient(logits, labels, weights, log_z=None):
    """`(weights_n (softmax(z_n) - onehot(y_n)) [C, V], logsumexp(z) [C])` of one chunk.

    Without `log_z` it is computed here, from the same exponentials as the
    softmax. The one-hot term is a scatter of `C` entries, not a `[C, V]` pass.
    """
    if log_z is None:
        top = tf.reduce_max(logits, axis=-1)
        exp = tf.exp(logits - top[:, None])
        total = tf.reduce_sum(exp, axis=-1)
        log_z = top + tf.math.log(total)
        d_logits = exp * (weights / total)[:, None]
    else:
        d_logits = tf.exp(logits - log_z[:, None]) * weights[:, None]
    label_slots = tf.stack([tf.range(tf.shape(labels)[0]), labels], axis=1)
    return tf.tensor_scatter_nd_sub(d_logits, label_slots, weights), log_z


def _chunked_loss(hidden, kernel, bias, labels, valid, scale, gradient_in_forward, parallel_iterations):
    """Per-token loss `[K, C]` of hidden `[K, C, d]` and labels `[K, C]`, with its custom gradient."""

    def loop(body, arrays, accumulators=()):
        num_chunks = tf.shape(hidden)[0]
        return tf.while_loop(
            lambda k, *_: k < num_chunks, body, [0, *arrays, *accumulators], parallel_iterations=parallel_iterations
        )[1:]

    def array(element_shape):
        return tf.TensorArray(hidden.dtype, size=tf.shape(hidden)[0], element_shape=element_shape)

    def gradients_step(k, d_logits, d_hidden, d_kernel, d_bias):
        """Adds chunk `k`'s share, from its logit gradient `[C, V]`, to the three gradients."""
        if d_hidden is not None:
            d_hidden = d_hidden.write(k, tf.matmul(d_logits, kernel, transpose_b=True))
        d_kernel = d_kernel + tf.matmul(hidden[k], d_logits, transpose_a=True)
        return d_hidden, d_kernel, d_bias + tf.reduce_sum(d_logits, axis=0)

    def weights(g):
        return g if scale is None else g * scale  # d z / d (h W + b) = s

    @tf.custom_gradient
    def loss_fn(hidden, kernel, bias):
        def forward(k, losses, log_z, *gradients):
            logits = _chunk_logits(hidden[k], kernel, bias, scale)
            label_logit = tf.gather(logits, labels[k], axis=1, batch_dims=1)
            if gradient_in_forward:  # the gradient for a weight of 1 on every real token, while the logits are here
                d_logits, chunk_log_z = _logit_gradient(logits, labels[k], weights(valid[k]))
                gradients = gradients_step(k, d_logits, *gradients)
            else:
                chunk_log_z = tf.reduce_logsumexp(logits, axis=-1)
            outputs = [losses.write(k, chunk_log_z - label_logit), log_z.write(k, chunk_log_z), *gradients]
            return [k + 1, *outputs]

        arrays, accumulators = [array(labels.shape[1:]), array(labels.shape[1:])], []
        if gradient_in_forward:
            arrays.append(array(hidden.shape[1:]))
            accumulators = [tf.zeros_like(kernel), tf.zeros_like(bias)]
        losses, log_z, *unit_gradients = loop(forward, arrays, accumulators)
        log_z = log_z.stack()

        def recomputed_gradients(upstream, with_hidden):
            def backward(k, *gradients):
                logits = _chunk_logits(hidden[k], kernel, bias, scale)
                d_logits, _ = _logit_gradient(logits, labels[k], weights(upstream[k]), log_z[k])
                gradients = gradients if with_hidden else (None, *gradients)
                d_hidden, d_kernel, d_bias = gradients_step(k, d_logits, *gradients)
                return [k + 1, d_kernel, d_bias] if d_hidden is None else [k + 1, d_hidden, d_kernel, d_bias]

            arrays = [array(hidden.shape[1:])] if with_hidden else []
            return loop(backward, arrays, [tf.zeros_like(kernel), tf.zeros_like(bias)])

        def grad(upstream):
            with tf.name_scope("chunked_cross_entropy_gradient"):
                return gradients(upstream)

        def gradients(upstream):
            if not gradient_in_forward:
                d_hidden, d_kernel, d_bias = recomputed_gradients(upstream, with_hidden=True)
                return d_hidden.stack(), d_kernel, d_bias
            d_hidden, d_kernel, d_bias = unit_gradients
            # dz_n = g_n * (unit gradient)_n: exact for the hidden states, token by token. For the
            # kernel and bias, sums over tokens, it is exact when g is one number on every real token
            # (a mean loss, as in training); other weights recompute the logits.
            real = tf.cast(valid, tf.bool)
            largest = tf.reduce_max(tf.where(real, upstream, tf.constant(-float("inf"), upstream.dtype)))
            smallest = tf.reduce_min(tf.where(real, upstream, tf.constant(float("inf"), upstream.dtype)))
            d_kernel, d_bias = tf.cond(
                tf.equal(largest, smallest),
                lambda: (largest * d_kernel, largest * d_bias),
                lambda: tuple(recomputed_gradients(upstream, with_hidden=False)),
            )
            return d_hidden.stack() * upstream[..., None], d_kernel, d_bias

        return losses.stack(), grad

    with tf.name_scope("chunked_cross_entropy"):
        return loss_fn(hidden, kernel, bias)


def chunked_cross_entropy(
    hidden,
    kernel,
    labels,
    bias=None,
    scale=1.0,
    chunk_size=DEFAULT_CROSS_ENTROPY_CHUNK,
    gradient_in_forward=False,
    parallel_iterations=1,
):
    """Per-token softmax cross-entropy of `s (hidden @ kernel + bias)`, without all the logits at once.

    Args:
        hidden: float `[..., d]`, the final hidden states.
        kernel: float `[d, V]`, the output layer (a tied embedding's transpose).
        labels: int `[...]`, the target ids in `[0, V)`.
        bias: optional float `[V]`.
        scale: float. Multiplies the logits (a tied head's `1/sqrt(d)`). Defaults to `1.0`.
        chunk_size: int. Tokens per chunk `C`: the peak holds `C x V` logits.
            Defaults to `512`.
        gradient_in_forward: bool. Also form the gradient in the forward pass,
            while each chunk's logits are at hand, so that the backward pass
            needs no second pass over the logits: one matrix product fewer
            when the loss is a mean (every token's upstream gradient the
            same, as in training). Other upstream gradients stay exact, at
            the cost of a recomputation. Leave it off for a loss that is not
            differentiated (evaluation). Defaults to `False`.
        parallel_iterations: int. Chunks in flight at once. Defaults to `1`.

    Returns:
        float32 loss `[...]` (float64 for float64 inputs): `logsumexp(z) - z[label]`,
        with gradients to `hidden`, `kernel` and `bias` in their own dtypes.

    Example:
    >>> hidden, kernel = tf.random.normal([2, 8, 16]), tf.random.normal([16, 100])
    >>> chunked_cross_entropy(hidden, kernel, tf.zeros([2, 8], tf.int32), chunk_size=4).shape
    TensorShape([2, 8])
    """
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"`chunk_size` must be a positive integer. Received: chunk_size={chunk_size}")
    dtype = accumulator_dtype(hidden.dtype)
    width, vocab_size = kernel.shape[0], kernel.shape[-1]
    if hidden.shape[-1] != width:
        raise ValueError(
            f"`hidden`'s last axis must be the kernel's input width {width}. Received: hidden.shape={hidden.shape}"
        )
    out_shape = tf.shape(labels)
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
    losses = _chunked_loss(hidden, kernel, bias, labels, valid, scale, gradient_in_forward, parallel_iterations)
    return tf.reshape(tf.reshape(losses, [-1])[:count], out_shape)
