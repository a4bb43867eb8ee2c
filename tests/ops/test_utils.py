import numpy as np
import pytest
import tensorflow as tf

from elita_tf.ops.pairwise_projection import pairwise_product, pairwise_projection


@pytest.mark.parametrize("rows", [1, 63, 100])
def test_pairwise_product_and_its_gradient_match_broadcasting(rows):
    rng = np.random.default_rng(0)
    alpha = tf.constant(rng.normal(size=(rows, 5)))
    beta = tf.constant(rng.normal(size=(rows, 3)))
    cotangent = tf.constant(rng.normal(size=(rows, 5, 3)))

    def run(fn):
        with tf.GradientTape() as tape:
            tape.watch([alpha, beta])
            product = fn(alpha, beta)
            loss = tf.reduce_sum(product * cotangent)
        return [product] + tape.gradient(loss, [alpha, beta])

    got = run(pairwise_product)
    want = run(lambda a, b: a[:, :, None] * b[:, None, :])
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_pairwise_product_gradient_passes_numerical_check():
    rng = np.random.default_rng(1)
    alpha, beta = tf.constant(rng.normal(size=(4, 3))), tf.constant(rng.normal(size=(4, 2)))
    theoretical, numerical = tf.test.compute_gradient(pairwise_product, [alpha, beta])
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-7, atol=1e-8)


def test_pairwise_product_keeps_a_low_precision_dtype():
    alpha, beta = tf.ones([2, 3], tf.bfloat16), tf.ones([2, 4], tf.bfloat16)
    with tf.GradientTape() as tape:
        tape.watch([alpha, beta])
        product = pairwise_product(alpha, beta)
    grads = tape.gradient(product, [alpha, beta])
    assert product.dtype == tf.bfloat16 and all(g.dtype == tf.bfloat16 for g in grads)
    np.testing.assert_array_equal(grads[0], 4 * np.ones([2, 3]))  # each alpha_i meets 4 betas
    np.testing.assert_array_equal(grads[1], 3 * np.ones([2, 4]))


@pytest.mark.parametrize("swish", [False, True])
@pytest.mark.parametrize("rows", [1, 63, 100])
@pytest.mark.parametrize("slice_rows", [8192, 32, 50])  # one slice; uneven slices; even slices
def test_pairwise_projection_and_its_gradients_match_the_einsum(rows, slice_rows, swish):
    rng = np.random.default_rng(2)
    alpha = tf.constant(rng.normal(size=(rows, 5)))
    beta = tf.constant(rng.normal(size=(rows, 3)))
    kernel = tf.constant(rng.normal(size=(5, 3, 4)))
    cotangent = tf.constant(rng.normal(size=(rows, 4)))

    def run(fn):
        with tf.GradientTape() as tape:
            tape.watch([alpha, beta, kernel])
            outputs = fn(alpha, beta, kernel)
            loss = tf.reduce_sum(outputs * cotangent)
        return [outputs] + tape.gradient(loss, [alpha, beta, kernel])

    got = run(lambda a, b, k: pairwise_projection(a, b, k, swish=swish, slice_rows=slice_rows))
    factor = (lambda z: z * tf.sigmoid(z)) if swish else (lambda z: z)
    want = run(lambda a, b, k: tf.einsum("na,nb,abw->nw", factor(a), factor(b), k))
    for g, w in zip(got, want):
        assert g.shape == w.shape and np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("swish", [False, True])
def test_pairwise_projection_gradient_passes_numerical_check(swish):
    rng = np.random.default_rng(3)
    inputs = [tf.constant(rng.normal(size=shape)) for shape in [(4, 3), (4, 2), (3, 2, 5)]]
    theoretical, numerical = tf.test.compute_gradient(lambda *t: pairwise_projection(*t, swish=swish), inputs)
    for t, n in zip(theoretical, numerical):
        # The swish's curvature adds up to about 2e-7 of finite-difference error; the einsum test above is exact.
        np.testing.assert_allclose(t, n, rtol=1e-6 if swish else 1e-7, atol=1e-6 if swish else 1e-8)


def test_pairwise_projection_keeps_a_low_precision_dtype():
    alpha, beta, kernel = tf.ones([2, 3], tf.bfloat16), tf.ones([2, 4], tf.bfloat16), tf.ones([3, 4, 5], tf.bfloat16)
    with tf.GradientTape() as tape:
        tape.watch([alpha, beta, kernel])
        outputs = pairwise_projection(alpha, beta, kernel)
    grads = tape.gradient(outputs, [alpha, beta, kernel])
    assert outputs.dtype == tf.bfloat16 and all(g.dtype == tf.bfloat16 for g in grads)
    np.testing.assert_array_equal(outputs, 12 * np.ones([2, 5]))
    np.testing.assert_array_equal(grads[2], 2 * np.ones([3, 4, 5]))  # summed over the two rows
