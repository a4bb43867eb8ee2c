import numpy as np
import pytest
from keras import ops

from elita_tf.ops.gated_projection import gated_output_projection
from tests.backend_utils import compiled, numpy, outputs_and_gradients, tensor
from tests.ops.gradient_checks import compute_gradient, output_and_gradient_dtypes


def naive(values, mean, gate_logits, kernel):
    """The definition: each head's gate between `values` and `mean`, then `Σ_{h,e} y[b,h,t,e] kernel[h,w,e]`."""
    gate = ops.sigmoid(gate_logits)[..., None]
    mixed = gate * values + (1 - gate) * mean
    return ops.einsum("bhte,hwe->btw", ops.cast(mixed, kernel.dtype), kernel)


def _arrays(batch=2, heads=3, length=7, depth=5, width=4, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [
        (batch, heads, length, depth),
        (batch, heads, length, depth),
        (batch, heads, length),
        (heads, width, depth),
    ]
    return [rng.normal(size=shape) * 2 for shape in shapes]


def _inputs(dtype="float64", **shape):
    return [tensor(x, dtype) for x in _arrays(**shape)]


@pytest.mark.parametrize("length", [1, 7, 33])
def test_outputs_and_gradients_match_the_definition(length):
    inputs = _inputs(length=length)
    cotangent = np.random.default_rng(1).normal(size=(2, length, 4))

    def run(fn):
        outputs, grads = outputs_and_gradients(fn, inputs, [cotangent])
        return outputs + grads

    for got, want in zip(run(gated_output_projection), run(naive)):
        assert got.shape == want.shape and np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_gradient_passes_numerical_check():
    inputs = _arrays(batch=1, heads=2, length=3, depth=2, width=3)
    theoretical, numerical = compute_gradient(gated_output_projection, inputs)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


def test_a_low_precision_kernel_takes_the_product_and_float32_keeps_the_gate():
    values, mean, gate_logits, kernel = _inputs(dtype="float32")
    kernel = ops.cast(kernel, "bfloat16")
    dtypes = output_and_gradient_dtypes(gated_output_projection, [values, mean, gate_logits, kernel])
    assert dtypes == ["bfloat16", "float32", "float32", "float32", "bfloat16"]
    outputs = numpy(gated_output_projection(values, mean, gate_logits, kernel)).astype(np.float64)
    # Against the float64 definition on the same bfloat16 kernel: a bfloat16 product of n terms
    # (its inputs rounded, its sum accumulated in bfloat16 or float32 by the CPU's kernel) is within
    # (n + 2) u of the sum of the terms' magnitudes, u = 2^-8 bfloat16's unit round-off.
    values, mean, gate_logits, kernel = (numpy(t).astype(np.float64) for t in (values, mean, gate_logits, kernel))
    exact = numpy(naive(*(tensor(t) for t in (values, mean, gate_logits, kernel))))
    gate = 1 / (1 + np.exp(-gate_logits))[..., None]
    mixed = gate * values + (1 - gate) * mean
    magnitude = np.einsum("bhte,hwe->btw", np.abs(mixed), np.abs(kernel))
    terms = kernel.shape[0] * kernel.shape[2]
    error = np.abs(outputs - exact)
    assert np.all(error <= (terms + 2) * 2.0**-8 * magnitude), (error / magnitude).max()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compiled_matches_eager(dtype):
    # XLA on TensorFlow, `jax.jit` on JAX (forward and backward), eager on PyTorch.
    inputs = _inputs(dtype=dtype, length=33)
    cotangent = np.random.default_rng(1).normal(size=(2, 33, 4))
    eager = outputs_and_gradients(gated_output_projection, inputs, [cotangent])
    got = outputs_and_gradients(compiled(gated_output_projection), inputs, [cotangent])
    tolerance = 1e-12 if dtype == "float64" else 1e-5
    for e, c in zip(eager[0] + eager[1], got[0] + got[1]):
        np.testing.assert_allclose(c, e, rtol=tolerance, atol=tolerance)


@pytest.mark.tf_only
def test_runs_under_xla_with_unknown_batch_and_length():
    import tensorflow as tf

    values, mean, gate_logits, kernel = _inputs(dtype="float32")
    spec = tf.TensorSpec([None, 3, None, 5])
    fn = tf.function(
        lambda v, m, z: tf.gradients(tf.reduce_sum(gated_output_projection(v, m, z, kernel) ** 2), [v, m, z]),
        input_signature=[spec, spec, tf.TensorSpec([None, 3, None])],
        jit_compile=True,
    )
    got = fn(values, mean, gate_logits)
    with tf.GradientTape() as tape:
        tape.watch([values, mean, gate_logits])
        loss = tf.reduce_sum(naive(values, mean, gate_logits, kernel) ** 2)
    for g, w in zip(got, tape.gradient(loss, [values, mean, gate_logits])):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
