"""Checks of custom gradients on every backend: Jacobians against NumPy central differences, and gradient dtypes."""

import keras
import numpy as np
from keras import ops

from tests.backend_utils import BACKEND, numpy, outputs_and_gradients, tensor


def output_and_gradient_dtypes(fn, args):
    """The Keras dtypes of `fn(*args)` (one tensor) and of the gradients of its sum, as the backend gives them."""
    args = [ops.convert_to_tensor(a) for a in args]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch(args)
            outputs = fn(*args)
        grads = tape.gradient(outputs, args)
    elif BACKEND == "jax":
        import jax

        outputs = fn(*args)
        grads = jax.grad(lambda *a: ops.sum(ops.cast(fn(*a), "float32")), argnums=tuple(range(len(args))))(*args)
    else:
        args = [a.detach().clone().requires_grad_(True) for a in args]
        outputs = fn(*args)
        outputs.sum().backward()
        grads = [a.grad for a in args]
    return [keras.backend.standardize_dtype(t.dtype) for t in [outputs, *grads]]


def compute_gradient(fn, inputs, delta=1.0 / 1024):
    """The theoretical and numerical Jacobians of `fn` (one tensor out) at the float64 `inputs`, one pair per input.

    As `tf.test.compute_gradient` computes them: the theoretical Jacobian row by row from the backend's
    gradients of one-hot cotangents, the numerical one by central differences `(f(x + δ) - f(x - δ)) / 2δ`
    on one entry at a time (`δ = 1/1024`, exact in binary), both `[size of x, size of y]`.
    """
    inputs = [np.asarray(x, np.float64) for x in inputs]
    forward = fn
    if BACKEND == "jax":  # eager JAX dispatches a chunked op in about 0.3 s: the 2·n evaluations run compiled
        import jax

        forward = jax.jit(fn)

    def evaluate(values):
        return numpy(forward(*(tensor(v) for v in values))).astype(np.float64)

    outputs = evaluate(inputs)
    theoretical = [np.zeros([x.size, outputs.size]) for x in inputs]
    for j in range(outputs.size):
        cotangent = np.zeros(outputs.size)
        cotangent[j] = 1.0
        _, grads = outputs_and_gradients(fn, [tensor(x) for x in inputs], [cotangent.reshape(outputs.shape)])
        for jacobian, g in zip(theoretical, grads):
            jacobian[:, j] = g.ravel()
    numerical = [np.zeros([x.size, outputs.size]) for x in inputs]
    for i, x in enumerate(inputs):
        for k in range(x.size):
            shifted = []
            for step in (delta, -delta):
                moved = x.copy()
                moved.ravel()[k] += step
                shifted.append(evaluate(inputs[:i] + [moved] + inputs[i + 1 :]))
            numerical[i][k] = ((shifted[0] - shifted[1]) / (2 * delta)).ravel()
    return theoretical, numerical
