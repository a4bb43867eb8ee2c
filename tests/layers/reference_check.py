"""The fla rule for layers: outputs and gradients against a naive reference."""

import numpy as np
import tensorflow as tf


def assert_matches_reference(layer, reference, x, variables, rtol, atol, seed=2):
    """`layer(x)` and `reference(x)` agree: outputs, and gradients of a random projection
    of the outputs with respect to `x` and every variable; everything finite.

    Args:
        layer: the layer (float64 for tight tolerances).
        reference: callable `x -> outputs`, the naive form built from the layer's weights.
        x: float inputs.
        variables: the layer's Keras variables whose gradients are compared.
    """
    cotangent = tf.constant(np.random.default_rng(seed).normal(size=x.shape), x.dtype)

    def outputs_and_gradients(fn):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
            loss = tf.reduce_sum(y * cotangent)
        grads = tape.gradient(loss, [x] + [v.value for v in variables])
        return [y] + [tf.convert_to_tensor(g) for g in grads]

    names = ["outputs", "inputs"] + [v.path for v in variables]
    for name, got, want in zip(names, outputs_and_gradients(layer), outputs_and_gradients(reference)):
        assert np.all(np.isfinite(got)), name
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)


def assert_mixed_precision_finite(layer, x):
    """Under a mixed policy: outputs in the compute dtype, variables float32, outputs and
    gradients of a mean-square loss finite."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        loss = tf.reduce_mean(tf.cast(y, tf.float32) ** 2)
    grads = tape.gradient(loss, layer.trainable_weights)
    assert y.dtype == layer.compute_dtype != "float32"
    assert all(w.dtype == "float32" for w in layer.weights)
    assert np.all(np.isfinite(tf.cast(y, tf.float32)))
    assert all(np.all(np.isfinite(g)) for g in grads)
