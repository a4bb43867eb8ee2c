import numpy as np
import pytest
import tensorflow as tf

from elita_tf.ops.gated_projection import gated_output_projection


def naive(values, mean, gate_logits, kernel):
    """The definition: each head's gate between `values` and `mean`, then `Σ_{h,e} y[b,h,t,e] kernel[h,w,e]`."""
    gate = tf.sigmoid(gate_logits)[..., None]
    mixed = gate * values + (1 - gate) * mean
    return tf.einsum("bhte,hwe->btw", tf.cast(mixed, kernel.dtype), kernel)


def _inputs(batch=2, heads=3, length=7, depth=5, width=4, dtype=tf.float64, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [
        (batch, heads, length, depth),
        (batch, heads, length, depth),
        (batch, heads, length),
        (heads, width, depth),
    ]
    return [tf.constant(rng.normal(size=shape) * 2, dtype) for shape in shapes]


@pytest.mark.parametrize("length", [1, 7, 33])
def test_outputs_and_gradients_match_the_definition(length):
    inputs = _inputs(length=length)
    cotangent = tf.constant(np.random.default_rng(1).normal(size=(2, length, 4)))

    def run(fn):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            outputs = fn(*inputs)
            loss = tf.reduce_sum(outputs * cotangent)
        return [outputs] + tape.gradient(loss, inputs)

    for got, want in zip(run(gated_output_projection), run(naive)):
        assert got.shape == want.shape and np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_gradient_passes_numerical_check():
    inputs = _inputs(batch=1, heads=2, length=3, depth=2, width=3)
    theoretical, numerical = tf.test.compute_gradient(gated_output_projection, inputs)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


def test_a_low_precision_kernel_takes_the_product_and_float32_keeps_the_gate():
    values, mean, gate_logits, kernel = _inputs(dtype=tf.float32)
    kernel = tf.cast(kernel, tf.bfloat16)
    with tf.GradientTape() as tape:
        tape.watch([values, mean, gate_logits, kernel])
        outputs = gated_output_projection(values, mean, gate_logits, kernel)
    grads = tape.gradient(outputs, [values, mean, gate_logits, kernel])
    assert outputs.dtype == tf.bfloat16
    assert [g.dtype for g in grads] == [tf.float32, tf.float32, tf.float32, tf.bfloat16]
    # Against the float64 definition on the same bfloat16 kernel: a bfloat16 product of n terms
    # (its inputs rounded, its sum accumulated in bfloat16 or float32 by the CPU's kernel) is within
    # (n + 2) u of the sum of the terms' magnitudes, u = 2^-8 bfloat16's unit round-off.
    exact = naive(*(tf.cast(t, tf.float64) for t in (values, mean, gate_logits, kernel)))
    gate = tf.sigmoid(tf.cast(gate_logits, tf.float64))[..., None]
    mixed = gate * tf.cast(values, tf.float64) + (1 - gate) * tf.cast(mean, tf.float64)
    magnitude = tf.einsum("bhte,hwe->btw", tf.abs(mixed), tf.abs(tf.cast(kernel, tf.float64)))
    terms = kernel.shape[0] * kernel.shape[2]
    error = np.abs(tf.cast(outputs, tf.float64) - exact)
    assert np.all(error <= (terms + 2) * 2.0**-8 * magnitude), (error / magnitude).max()


def test_runs_under_xla_with_unknown_batch_and_length():
    values, mean, gate_logits, kernel = _inputs(dtype=tf.float32)
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
