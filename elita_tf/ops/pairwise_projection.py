"""FeedForward2's kernel: per-row outer products of two branches, and their projection without keeping them."""

import tensorflow as tf
from keras import ops


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
    return ops.matmul(ops.expand_dims(u, -1), ops.expand_dims(v, -2))


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
