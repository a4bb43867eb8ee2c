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
one more `[N, d] x [d, V]` product (the recomputation). All arithmetic is
float32 (float64 stays float64) whatever the input dtype.
"""

import tensorflow as tf

from elita_tf.ops.utils import accumulator_dtype

DEFAULT_CROSS_ENTROPY_CHUNK = 1024


def _chunk_logits(hidden, kernel, bias, scale):
    return (tf.matmul(hidden, kernel) + bias) * scale  # [C, V]


def _chunked_loss(hidden, kernel, bias, labels, scale, parallel_iterations):
    """Per-token loss `[K, C]` of hidden `[K, C, d]` and labels `[K, C]`, with its custom gradient."""

    @tf.custom_gradient
    def loss_fn(hidden, kernel, bias):
        num_chunks = tf.shape(hidden)[0]

        def forward(k, losses, log_z):
            logits = _chunk_logits(hidden[k], kernel, bias, scale)
            chunk_log_z = tf.reduce_logsumexp(logits, axis=-1)
            label_logit = tf.gather(logits, labels[k], axis=1, batch_dims=1)
            return k + 1, losses.write(k, chunk_log_z - label_logit), log_z.write(k, chunk_log_z)

        arrays = [tf.TensorArray(hidden.dtype, size=num_chunks, element_shape=labels.shape[1:]) for _ in range(2)]
        _, losses, log_z = tf.while_loop(
            lambda k, *_: k < num_chunks, forward, [0, *arrays], parallel_iterations=parallel_iterations
        )
        log_z = log_z.stack()

        def grad(upstream):
            def backward(k, d_hidden, d_kernel, d_bias):
                logits = _chunk_logits(hidden[k], kernel, bias, scale)
                probs = tf.exp(logits - log_z[k][:, None])
                onehot = tf.one_hot(labels[k], tf.shape(logits)[-1], dtype=probs.dtype)
                d_logits = (probs - onehot) * (upstream[k][:, None] * scale)  # [C, V]
                return (
                    k + 1,
                    d_hidden.write(k, tf.matmul(d_logits, kernel, transpose_b=True)),
                    d_kernel + tf.matmul(hidden[k], d_logits, transpose_a=True),
                    d_bias + tf.reduce_sum(d_logits, axis=0),
                )

            d_hidden = tf.TensorArray(hidden.dtype, size=num_chunks, element_shape=hidden.shape[1:])
            _, d_hidden, d_kernel, d_bias = tf.while_loop(
                lambda k, *_: k < num_chunks,
                backward,
                [0, d_hidden, tf.zeros_like(kernel), tf.zeros_like(bias)],
                parallel_iterations=parallel_iterations,
            )
            return d_hidden.stack(), d_kernel, d_bias

        return losses.stack(), grad

    return loss_fn(hidden, kernel, bias)


def chunked_cross_entropy(
    hidden, kernel, labels, bias=None, scale=1.0, chunk_size=DEFAULT_CROSS_ENTROPY_CHUNK, parallel_iterations=1
):
    """Per-token softmax cross-entropy of `s (hidden @ kernel + bias)`, without all the logits at once.

    Args:
        hidden: float `[..., d]`, the final hidden states.
        kernel: float `[d, V]`, the output layer (a tied embedding's transpose).
        labels: int `[...]`, the target ids in `[0, V)`.
        bias: optional float `[V]`.
        scale: float. Multiplies the logits (a tied head's `1/sqrt(d)`). Defaults to `1.0`.
        chunk_size: int. Tokens per chunk `C`: the peak holds `C x V` logits.
            Defaults to `1024`.
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
    labels = tf.reshape(tf.pad(labels, [[0, pad]]), [-1, chunk_size])
    bias = tf.zeros([vocab_size], dtype) if bias is None else tf.cast(bias, dtype)
    scale = tf.cast(scale, dtype) if tf.is_tensor(scale) else tf.constant(scale, dtype)  # a Python float stays exact
    losses = _chunked_loss(hidden, tf.cast(kernel, dtype), bias, labels, scale, parallel_iterations)
    return tf.reshape(tf.reshape(losses, [-1])[:count], out_shape)
