import numpy as np
import pytest
from keras import ops

from elita_tf.ops.pairwise_projection import pairwise_product, pairwise_projection
from tests.backend_utils import compiled, numpy, outputs_and_gradients, tensor
from tests.ops.gradient_checks import compute_gradient, output_and_gradient_dtypes


def _run(fn, inputs, cotangent):
    outputs, grads = outputs_and_gradients(fn, inputs, [cotangent])
    return outputs + grads


@pytest.mark.parametrize("rows", [1, 63, 100])
def test_pairwise_product_and_its_gradient_match_broadcasting(rows):
    rng = np.random.default_rng(0)
    alpha = tensor(rng.normal(size=(rows, 5)))
    beta = tensor(rng.normal(size=(rows, 3)))
    cotangent = rng.normal(size=(rows, 5, 3))
    got = _run(pairwise_product, [alpha, beta], cotangent)
    want = _run(lambda a, b: a[:, :, None] * b[:, None, :], [alpha, beta], cotangent)
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_pairwise_product_gradient_passes_numerical_check():
    rng = np.random.default_rng(1)
    alpha, beta = rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    theoretical, numerical = compute_gradient(pairwise_product, [alpha, beta])
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-7, atol=1e-8)


def test_pairwise_product_keeps_a_low_precision_dtype():
    alpha, beta = ops.ones([2, 3], "bfloat16"), ops.ones([2, 4], "bfloat16")
    assert output_and_gradient_dtypes(pairwise_product, [alpha, beta]) == ["bfloat16"] * 3
    _, grads = outputs_and_gradients(pairwise_product, [alpha, beta], [np.ones([2, 3, 4], np.float32)])
    np.testing.assert_array_equal(grads[0], 4 * np.ones([2, 3]))  # each alpha_i meets 4 betas
    np.testing.assert_array_equal(grads[1], 3 * np.ones([2, 4]))


def _projection_inputs(rows, seed=2):
    rng = np.random.default_rng(seed)
    alpha, beta, kernel = rng.normal(size=(rows, 5)), rng.normal(size=(rows, 3)), rng.normal(size=(5, 3, 4))
    return [tensor(alpha), tensor(beta), tensor(kernel)], rng.normal(size=(rows, 4))


@pytest.mark.parametrize("swish", [False, True])
@pytest.mark.parametrize("rows", [1, 63, 100])
@pytest.mark.parametrize("slice_rows", [8192, 32, 50])  # one slice; uneven slices; even slices
def test_pairwise_projection_and_its_gradients_match_the_einsum(rows, slice_rows, swish):
    inputs, cotangent = _projection_inputs(rows)
    got = _run(lambda a, b, k: pairwise_projection(a, b, k, swish=swish, slice_rows=slice_rows), inputs, cotangent)
    factor = (lambda z: z * ops.sigmoid(z)) if swish else (lambda z: z)
    want = _run(lambda a, b, k: ops.einsum("na,nb,abw->nw", factor(a), factor(b), k), inputs, cotangent)
    for g, w in zip(got, want):
        assert g.shape == w.shape and np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("swish", [False, True])
def test_pairwise_projection_gradient_passes_numerical_check(swish):
    rng = np.random.default_rng(3)
    inputs = [rng.normal(size=shape) for shape in [(4, 3), (4, 2), (3, 2, 5)]]
    theoretical, numerical = compute_gradient(lambda *t: pairwise_projection(*t, swish=swish), inputs)
    for t, n in zip(theoretical, numerical):
        # The swish's curvature adds up to about 2e-7 of finite-difference error; the einsum test above is exact.
        np.testing.assert_allclose(t, n, rtol=1e-6 if swish else 1e-7, atol=1e-6 if swish else 1e-8)


def test_pairwise_projection_keeps_a_low_precision_dtype():
    alpha, beta = ops.ones([2, 3], "bfloat16"), ops.ones([2, 4], "bfloat16")
    kernel = ops.ones([3, 4, 5], "bfloat16")
    assert output_and_gradient_dtypes(pairwise_projection, [alpha, beta, kernel]) == ["bfloat16"] * 4
    outputs, grads = outputs_and_gradients(pairwise_projection, [alpha, beta, kernel], [np.ones([2, 5], np.float32)])
    np.testing.assert_array_equal(outputs[0], 12 * np.ones([2, 5]))
    np.testing.assert_array_equal(grads[2], 2 * np.ones([3, 4, 5]))  # summed over the two rows


@pytest.mark.parametrize("swish", [False, True])
@pytest.mark.parametrize("slice_rows", [8192, 32])
def test_compiled_matches_eager(slice_rows, swish):
    # XLA on TensorFlow, `jax.jit` on JAX (forward and backward), eager on PyTorch.
    inputs, cotangent = _projection_inputs(100)
    for fn in (
        lambda a, b, k: pairwise_projection(a, b, k, swish=swish, slice_rows=slice_rows),
        lambda a, b, k: pairwise_product(a, b),
    ):
        cotangents = cotangent if fn(*inputs).shape == cotangent.shape else np.ones([100, 5, 3])
        eager = _run(fn, inputs, cotangents)
        got = _run(compiled(fn), inputs, cotangents)
        for e, c in zip(eager, got):
            np.testing.assert_allclose(c, e, rtol=1e-12, atol=1e-12)
