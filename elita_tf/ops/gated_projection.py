"""A gate between two per-head sequences, then a projection of all heads (docs/math.md §2).

    y_{h,t} = mean_{h,t} + sigmoid(z_{h,t}) (values_{h,t} - mean_{h,t})
    out_t   = Σ_h kernel_h y_{h,t}

This is how ELiTA's `Attention2` ends: a gate between each position's value
and its causal mean, then the output projection. Written out with Keras
layers, the backward pass keeps two `[B, H, T, D]` tensors for it, the
difference `values - mean` (for the gate's gradient) and the gated `y`
(for the projection's kernel gradient), besides the values, which the
causal mean keeps anyway. Here it keeps `mean` alone and recomputes the
difference and `y` (a few elementwise passes) when the gradient is taken.
"""

import keras
from keras import ops

from elita_tf import backend


def gate_and_mix(values, mean, gate_logits):
    """The gate `g = sigmoid(gate_logits)[..., None]`, `values - mean`, and the gated `mean + g (values - mean)`."""
    gate = ops.expand_dims(ops.sigmoid(gate_logits), -1)
    difference = values - mean
    return gate, difference, mean + gate * difference


def gated_output_projection(values, mean, gate_logits, kernel):
    """`Σ_h kernel_h (mean + sigmoid(z) (values - mean))_h`, holding only `mean` for the backward pass.

    Args:
        values: `[B, H, T, D]`, the gate's open side.
        mean: `[B, H, T, D]`, the gate's closed side, in the dtype of `values`.
        gate_logits: `[B, H, T]`, `z`, in the dtype of `values`.
        kernel: `[H, W, D]`, the projection (`Attention2`'s `output_kernel`
            layout); the product is taken in its dtype (the compute dtype
            under a mixed policy).

    Returns:
        `[B, T, W]` in the kernel's dtype.

    Example:
    >>> values, mean = keras.random.normal([2, 4, 10, 16]), keras.random.normal([2, 4, 10, 16])
    >>> tuple(gated_output_projection(values, mean, keras.ops.zeros([2, 4, 10]), keras.ops.ones([4, 8, 16])).shape)
    (2, 10, 8)
    """
    heads, width, depth = kernel.shape
    kernel_dtype = kernel.dtype
    batch, length = ops.shape(values)[0], ops.shape(values)[2]

    def rows(x):
        """`[B, H, T, D]` to `[B * T, H * D]` in the kernel's dtype: the projection is one matrix product."""
        return ops.reshape(ops.transpose(ops.cast(x, kernel_dtype), [0, 2, 1, 3]), [-1, heads * depth])

    @backend.custom_gradient
    def project(values, mean, gate_logits, kernel):
        flat_kernel = ops.reshape(ops.transpose(kernel, [0, 2, 1]), [heads * depth, width])  # small
        mixed = gate_and_mix(values, mean, gate_logits)[2]
        outputs = ops.reshape(backend.matmul(rows(mixed), flat_kernel), [batch, length, width])

        def grad(upstream):
            with keras.name_scope("gated_projection_gradient"):
                # else every layer recomputes at once, early
                gate, difference, mixed = backend.ordered([upstream], lambda: gate_and_mix(values, mean, gate_logits))
                upstream = ops.reshape(upstream, [-1, width])
                d_kernel = ops.reshape(backend.matmul(rows(mixed), upstream, transpose_a=True), [heads, depth, width])
                d_kernel = ops.transpose(d_kernel, [0, 2, 1])
                d_mixed = backend.matmul(upstream, flat_kernel, transpose_b=True)
                d_mixed = ops.reshape(d_mixed, [batch, length, heads, depth])
                d_mixed = ops.cast(ops.transpose(d_mixed, [0, 2, 1, 3]), values.dtype)  # [B, H, T, D]
                d_values = gate * d_mixed
                d_gate = ops.sum(d_mixed * difference, -1) * gate[..., 0] * (1 - gate[..., 0])
                return d_values, d_mixed - d_values, d_gate, d_kernel

        return outputs, grad

    return project(values, mean, gate_logits, kernel)
