"""Layer normalisation without scale or centre, with a gradient that keeps only its output (docs/math.md §8).

Over the last axis of `x` (width `d`):

    μ = mean(x),   σ² = mean((x - μ)²),   r = 1 / sqrt(σ² + ε),   y = (x - μ) r

and, for an upstream gradient `g`,

    dx = r (g - mean(g) - y mean(g y))

The gradient reads `y` and `r`, not `x`. Plain automatic differentiation keeps
a float32 copy of `x` for the backward pass (the statistics are float32 under
mixed precision); here the backward pass reads the output, which the next
layer keeps anyway, and `r`, one number a row. Under `mixed_bfloat16` that is
a `[B, T, d]` float32 array less per norm, held from the forward pass to the
backward pass. The statistics and the gradient are float32 (float64 stays
float64); `y` is read back in the compute dtype, so with bfloat16 the
gradient carries bfloat16's rounding of `y` (relative 2^-9), the precision
the gradient has once it is cast to bfloat16.
"""

import tensorflow as tf

from elita_tf.ops.utils.dtypes import accumulator_dtype


def unscaled_layer_norm(x, epsilon=1e-3):
    """`(x - mean(x)) / sqrt(var(x) + epsilon)` over the last axis, in float32, returned in `x`'s dtype.

    Args:
        x: float tensor `[..., d]`.
        epsilon: float. Added to the variance. Defaults to `1e-3`.

    Returns:
        A tensor of `x`'s shape and dtype.

    Example:
    >>> y = unscaled_layer_norm(tf.constant([[1.0, 2.0, 3.0]]))
    >>> [round(float(v), 3) for v in y[0]]
    [-1.224, 0.0, 1.224]
    """
    dtype = x.dtype
    acc = accumulator_dtype(dtype)

    @tf.custom_gradient
    def norm(x):
        wide = tf.cast(x, acc)
        mean, variance = tf.nn.moments(wide, axes=[-1], keepdims=True)
        inv = tf.math.rsqrt(variance + epsilon)
        outputs = tf.cast(wide * inv - mean * inv, dtype)

        def grad(upstream):
            with tf.name_scope("layer_norm_gradient"):
                with tf.control_dependencies([upstream]):  # widen y when its gradient is due, not all norms' at once
                    y = tf.cast(outputs, acc)
                g = tf.cast(upstream, acc)
                centred = g - tf.reduce_mean(g, axis=-1, keepdims=True)
                return tf.cast(inv * (centred - y * tf.reduce_mean(g * y, axis=-1, keepdims=True)), dtype)

        return outputs, grad

    return norm(x)
