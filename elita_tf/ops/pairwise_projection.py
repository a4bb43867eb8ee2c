"""FeedForward2's kernel: per-row outer products of two branches, and their projection without keeping them."""

import functools
import operator

import keras
from keras import ops

from elita_tf import backend


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
    return backend.matmul(ops.expand_dims(u, -1), ops.expand_dims(v, -2))


def pairwise_product(alpha, beta):
    """`alpha [N, a]` and `beta [N, b]` to their per-row outer product `[N, a, b]`: `alpha_i beta_j`.

    The gradient is two batched matrix-vector products, `dalpha = dP beta`
    and `dbeta = alphaᵀ dP` per row, rather than the broadcast multiplies
    and reductions TensorFlow derives for `alpha[:, :, None] * beta[:, None, :]`:
    each reads the `[N, a, b]` gradient once (about a third less time for
    `FeedForward2`'s backward pass on a CPU).
    """
    return _pairwise_product(alpha, beta)


@backend.custom_gradient
def _pairwise_product(alpha, beta):
    product = outer_product(alpha, beta)

    def grad(upstream):
        with keras.name_scope("pairwise_product_gradient"):
            d_alpha = ops.squeeze(backend.matmul(upstream, ops.expand_dims(beta, 2)), 2)
            d_beta = ops.squeeze(backend.matmul(ops.expand_dims(alpha, 1), upstream), 1)
        return d_alpha, d_beta

    return product, grad


def _swish_and_slope(x):
    """`swish(x) = x sigmoid(x)` and its derivative `sigmoid(x) (1 + x (1 - sigmoid(x)))`."""
    s = ops.sigmoid(x)
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

    def slices(*tensors):
        rows = tensors[0].shape[0]
        if rows is None or rows <= slice_rows:
            return [tensors]
        # rows `start .. start + slice_rows` (Python's slices, not Keras' `split`, which on PyTorch reads its
        # indices back from a tensor, and no `"meta"` tensor of Keras' shape inference has values to read)
        return [tuple(t[start : start + slice_rows] for t in tensors) for start in range(0, rows, slice_rows)]

    def in_turn(parts, step, after=()):
        """`step` on each slice, each after the previous slice's results exist."""
        results = []
        for part in parts:
            result = backend.ordered(list(after), lambda part=part: step(*part))
            results.append(result)
            after = keras.tree.flatten(result)
        return results

    def join(parts):
        return parts[0] if len(parts) == 1 else ops.concatenate(parts, 0)

    @backend.custom_gradient
    def project(alpha, beta, kernel):
        flat_kernel = ops.reshape(kernel, [a * b, width])

        def project_slice(alpha, beta):
            if swish:
                alpha, beta = ops.silu(alpha), ops.silu(beta)
            product = ops.reshape(outer_product(alpha, beta), [-1, a * b])
            return backend.matmul(product, flat_kernel)

        def grad(upstream):
            with keras.name_scope("pairwise_projection_gradient"):

                def slice_gradients(alpha, beta, upstream):
                    if swish:  # the factors again, and the slopes that take their gradients to the pre-activations
                        (alpha, alpha_slope), (beta, beta_slope) = _swish_and_slope(alpha), _swish_and_slope(beta)
                    beta_upstream = outer_product(beta, upstream)  # [rows, b, w]
                    d_kernel = backend.matmul(alpha, ops.reshape(beta_upstream, [-1, b * width]), transpose_a=True)
                    # the [rows, a, b] gradient once that factor is used
                    d_product = backend.ordered(
                        [d_kernel],
                        lambda: ops.reshape(backend.matmul(upstream, flat_kernel, transpose_b=True), [-1, a, b]),
                    )
                    d_alpha = ops.squeeze(backend.matmul(d_product, ops.expand_dims(beta, 2)), 2)
                    d_beta = ops.squeeze(backend.matmul(ops.expand_dims(alpha, 1), d_product), 1)
                    if swish:
                        d_alpha, d_beta = d_alpha * alpha_slope, d_beta * beta_slope
                    return d_kernel, d_alpha, d_beta

                d_kernel, d_alpha, d_beta = zip(*in_turn(slices(alpha, beta, upstream), slice_gradients))
                d_kernel = functools.reduce(operator.add, d_kernel)  # a sum over the slices
                return join(d_alpha), join(d_beta), ops.reshape(d_kernel, [a, b, width])

        return join(in_turn(slices(alpha, beta), project_slice)), grad

    return project(alpha, beta, kernel)
