import keras
import numpy as np
import pytest
import tensorflow as tf

from elita_tf.layers import UnscaledLayerNormalization
from elita_tf.ops import unscaled_layer_norm


def _reference(x, epsilon):
    """Plain autodiff through float32 (float64) statistics, as Keras' LayerNormalization computes them."""
    wide = tf.cast(x, tf.float64 if x.dtype == tf.float64 else tf.float32)
    mean, variance = tf.nn.moments(wide, axes=[-1], keepdims=True)
    return tf.cast((wide - mean) * tf.math.rsqrt(variance + epsilon), x.dtype)


def _value_and_gradient(fn, x, upstream):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
        total = tf.reduce_sum(tf.cast(y, tf.float64) * upstream)
    return y, tape.gradient(total, x)


def _inputs(dtype, shape=(3, 5, 16), seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * 3.0 + 1.5
    upstream = tf.constant(rng.normal(size=shape))
    return tf.constant(x, dtype), upstream


@pytest.mark.parametrize("epsilon", [1e-3, 1e-5])
def test_float64_output_and_gradient_match_reference(epsilon):
    x, upstream = _inputs(tf.float64)
    got = _value_and_gradient(lambda t: unscaled_layer_norm(t, epsilon), x, upstream)
    want = _value_and_gradient(lambda t: _reference(t, epsilon), x, upstream)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_gradient_passes_numerical_check():
    x, _ = _inputs(tf.float64, shape=(2, 6))
    theoretical, numerical = tf.test.compute_gradient(lambda t: unscaled_layer_norm(t, 1e-3), [x])
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-6, atol=1e-7)


def test_bfloat16_gradient_is_within_bfloat16_rounding():
    # The backward pass reads the bfloat16 output: the gradient is as close to the float32 one as bfloat16 allows.
    x, upstream = _inputs(tf.float32, shape=(4, 7, 64))
    low = tf.cast(x, tf.bfloat16)
    y, dx = _value_and_gradient(lambda t: unscaled_layer_norm(t, 1e-3), low, upstream)
    want_y, want_dx = _value_and_gradient(lambda t: _reference(tf.cast(t, tf.float32), 1e-3), low, upstream)
    assert y.dtype == tf.bfloat16 and dx.dtype == tf.bfloat16
    np.testing.assert_array_equal(tf.cast(y, tf.float32), tf.cast(tf.cast(want_y, tf.bfloat16), tf.float32))
    scale = np.max(np.abs(want_dx))
    np.testing.assert_allclose(tf.cast(dx, tf.float32), want_dx, atol=2**-7 * scale)


def test_layer_matches_keras_layer_normalization_and_round_trips():
    x, _ = _inputs(tf.float32)
    ours = UnscaledLayerNormalization(epsilon=1e-3)
    keras_norm = keras.layers.LayerNormalization(epsilon=1e-3, center=False, scale=False)
    np.testing.assert_allclose(ours(x), keras_norm(x), rtol=1e-5, atol=1e-5)
    restored = UnscaledLayerNormalization.from_config(ours.get_config())
    assert restored.epsilon == 1e-3
    mixed = UnscaledLayerNormalization(epsilon=1e-3, dtype="mixed_bfloat16")
    assert mixed(x).dtype == tf.bfloat16


def test_under_xla_matches_eager():
    x, upstream = _inputs(tf.float32)
    fn = lambda t: unscaled_layer_norm(t, 1e-3)  # noqa: E731
    eager = _value_and_gradient(fn, x, upstream)
    compiled = tf.function(lambda t: _value_and_gradient(fn, t, upstream), jit_compile=True)(x)
    for e, c in zip(eager, compiled):
        np.testing.assert_allclose(c, e, rtol=1e-5, atol=1e-5)
