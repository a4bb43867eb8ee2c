import keras
import numpy as np
import pytest
from keras import ops

from elita_tf.layers import UnscaledLayerNormalization
from elita_tf.ops import unscaled_layer_norm
from elita_tf.ops.utils.dtypes import dtype_of
from tests.backend_utils import compiled, numpy, outputs_and_gradients, tensor
from tests.ops.gradient_checks import compute_gradient, output_and_gradient_dtypes


def _reference(x, epsilon):
    """Plain autodiff through float32 (float64) statistics, as Keras' LayerNormalization computes them."""
    dtype = dtype_of(x)
    wide = ops.cast(x, "float64" if dtype == "float64" else "float32")
    width = x.shape[-1]  # sums over it: `ops.mean` computes float64 in float32 on JAX and PyTorch
    mean = ops.sum(wide, axis=-1, keepdims=True) / width
    variance = ops.sum(ops.square(wide - mean), axis=-1, keepdims=True) / width
    return ops.cast((wide - mean) * ops.rsqrt(variance + epsilon), dtype)


def _value_and_gradient(fn, x, upstream):
    (y,), (dx,) = outputs_and_gradients(fn, [x], [upstream])
    return y, dx


def _inputs(dtype, shape=(3, 5, 16), seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * 3.0 + 1.5
    upstream = rng.normal(size=shape)
    return tensor(x, dtype), upstream


@pytest.mark.parametrize("epsilon", [1e-3, 1e-5])
def test_float64_output_and_gradient_match_reference(epsilon):
    x, upstream = _inputs("float64")
    got = _value_and_gradient(lambda t: unscaled_layer_norm(t, epsilon), x, upstream)
    want = _value_and_gradient(lambda t: _reference(t, epsilon), x, upstream)
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_gradient_passes_numerical_check():
    x, _ = _inputs("float64", shape=(2, 6))
    theoretical, numerical = compute_gradient(lambda t: unscaled_layer_norm(t, 1e-3), [numpy(x)])
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-6, atol=1e-7)


def test_bfloat16_gradient_is_within_bfloat16_rounding():
    # The backward pass reads the bfloat16 output: the gradient is as close to the float32 one as bfloat16 allows.
    x, upstream = _inputs("float32", shape=(4, 7, 64))
    low = ops.cast(x, "bfloat16")
    y, dx = _value_and_gradient(lambda t: unscaled_layer_norm(t, 1e-3), low, upstream)
    want_y, want_dx = _value_and_gradient(lambda t: _reference(ops.cast(t, "float32"), 1e-3), low, upstream)
    assert output_and_gradient_dtypes(lambda t: unscaled_layer_norm(t, 1e-3), [low]) == ["bfloat16", "bfloat16"]
    np.testing.assert_array_equal(y, numpy(ops.cast(tensor(want_y), "bfloat16")))
    scale = np.max(np.abs(want_dx))
    np.testing.assert_allclose(dx, want_dx, atol=2**-7 * scale)


def test_layer_matches_keras_layer_normalization_and_round_trips():
    x, _ = _inputs("float32")
    ours = UnscaledLayerNormalization(epsilon=1e-3)
    keras_norm = keras.layers.LayerNormalization(epsilon=1e-3, center=False, scale=False)
    np.testing.assert_allclose(numpy(ours(x)), numpy(keras_norm(x)), rtol=1e-5, atol=1e-5)
    restored = UnscaledLayerNormalization.from_config(ours.get_config())
    assert restored.epsilon == 1e-3
    mixed = UnscaledLayerNormalization(epsilon=1e-3, dtype="mixed_bfloat16")
    assert dtype_of(mixed(x)) == "bfloat16"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compiled_matches_eager(dtype):
    # XLA on TensorFlow, `jax.jit` on JAX (forward and backward), eager on PyTorch.
    x, upstream = _inputs(dtype)
    fn = lambda t: unscaled_layer_norm(t, 1e-3)  # noqa: E731
    eager = _value_and_gradient(fn, x, upstream)
    got = _value_and_gradient(compiled(fn), x, upstream)
    tolerance = 1e-12 if dtype == "float64" else 1e-5
    for e, c in zip(eager, got):
        np.testing.assert_allclose(c, e, rtol=tolerance, atol=tolerance)


@pytest.mark.tf_only
def test_under_xla_matches_eager():
    import tensorflow as tf

    x, upstream = _inputs("float32")
    upstream = tf.constant(upstream)
    fn = lambda t: unscaled_layer_norm(t, 1e-3)  # noqa: E731

    def value_and_gradient(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = fn(t)
            total = tf.reduce_sum(tf.cast(y, tf.float64) * upstream)
        return y, tape.gradient(total, t)

    eager = value_and_gradient(x)
    compiled_xla = tf.function(value_and_gradient, jit_compile=True)(x)
    for e, c in zip(eager, compiled_xla):
        np.testing.assert_allclose(c, e, rtol=1e-5, atol=1e-5)
