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

import keras
from keras import ops

from elita_tf import backend
from elita_tf.ops.utils.dtypes import accumulator_dtype, dtype_of


def _mean(x):
    """The mean over the last axis, in `x`'s dtype (`ops.mean` computes float64 in float32 off TensorFlow)."""
    return ops.sum(x, axis=-1, keepdims=True) / x.shape[-1]


def unscaled_layer_norm(x, epsilon=1e-3):
    """`(x - mean(x)) / sqrt(var(x) + epsilon)` over the last axis, in float32, returned in `x`'s dtype.

    Args:
        x: float tensor `[..., d]`.
        epsilon: float. Added to the variance. Defaults to `1e-3`.

    Returns:
        A tensor of `x`'s shape and dtype.

    Example:
    >>> y = unscaled_layer_norm(keras.ops.convert_to_tensor([[1.0, 2.0, 3.0]]))
    >>> [round(float(v), 3) for v in keras.ops.convert_to_numpy(y)[0]]
    [-1.224, 0.0, 1.224]
    """
    dtype = dtype_of(x)
    acc = accumulator_dtype(dtype)

    @backend.custom_gradient
    def norm(x):
        wide = ops.cast(x, acc)
        mean, variance = ops.moments(wide, axes=[-1], keepdims=True)
        inv = ops.rsqrt(variance + epsilon)
        outputs = ops.cast(wide * inv - mean * inv, dtype)

        def grad(upstream):
            with keras.name_scope("layer_norm_gradient"):
                # widen y when its gradient is due, not all norms' at once
                y = backend.ordered([upstream], lambda: ops.cast(outputs, acc))
                g = ops.cast(upstream, acc)
                centred = g - _mean(g)
                return (ops.cast(inv * (centred - y * _mean(g * y)), dtype),)

        return outputs, grad

    return norm(x)
