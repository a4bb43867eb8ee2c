import warnings

import numpy as np
import pytest
from keras import ops

from elita_tf.layers.shaped_attention import ShapedAttention
from tests.backend_utils import compiled, numpy, random_normal, tensor
from tests.layers.keras_float64 import DENSE, float64_tolerance
from tests.layers.reference_check import assert_matches_reference

WIDTH = 8


def _layer(dtype="float32", **kwargs):
    layer = ShapedAttention(**{"num_heads": 2, "max_sequence_length": 300, **kwargs}, dtype=dtype)
    layer.build((None, None, WIDTH))
    rng = np.random.default_rng(0)
    for var in layer.weights:
        var.assign(rng.normal(size=var.shape) * 0.5 + (1.0 if "gain" in var.path else 0.0))
    return layer


def reference(layer, x, mask=None):
    """`A = αI + β S − γ C` materialised, `C` the explicit causal averaging matrix, in float64."""
    w = lambda v: ops.cast(v.value, "float64")  # noqa: E731
    x = ops.cast(x, "float64")
    b, length, _ = x.shape
    values = x
    if layer.value_projection:
        values = w(layer.value_gain) * x @ w(layer.value_kernel) + w(layer.value_skip_gain) * x
    v = ops.reshape(values, (b, length, layer.num_heads, -1))
    q = ops.einsum("btd,dhe->bhte", x, w(layer.query_kernel)) + w(layer.query_bias)[:, None]
    k = ops.einsum("btd,dhe->bhte", x, w(layer.key_kernel)) + w(layer.key_bias)[:, None]
    visible = np.tril(np.ones((length, length), bool))[None, None]
    if mask is not None:
        visible = visible & np.asarray(mask, bool)[:, None, None, :]
    scores = ops.einsum("bhte,bhse->bhts", q, k) / np.sqrt(q.shape[-1])
    s = ops.softmax(ops.where(visible, scores, -1e300), axis=-1)
    c = tensor(visible / np.maximum(visible.sum(-1, keepdims=True), 1), "float64")
    eye = tensor(np.eye(length)[None, None])
    gain = lambda g: w(g)[None, :, None, None]  # noqa: E731
    a = gain(layer.alpha) * eye + gain(layer.beta) * s - gain(layer.gamma) * c
    return ops.reshape(ops.einsum("bhts,bshe->bthe", a, v), (b, length, -1))


def test_identity_at_initialisation():
    layer = ShapedAttention(num_heads=2)
    x = random_normal((2, 30, WIDTH), seed=0)
    np.testing.assert_allclose(numpy(layer(x)), numpy(x), atol=1e-5)


def test_one_position_without_a_cache_gives_no_warning():
    # A softmax over one key is 1: Keras would warn of it on every call of a one-token sequence.
    layer = ShapedAttention(num_heads=2, value_projection=True)
    x = random_normal((2, 1, WIDTH), seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert np.isfinite(numpy(layer(x))).all()


@pytest.mark.parametrize("length", [1, 63, 100, 257])
@pytest.mark.parametrize("value_projection", [False, True])
def test_outputs_and_gradients_match_reference(length, value_projection):
    layer = _layer("float64", value_projection=value_projection)
    x = tensor(np.random.default_rng(1).normal(size=(2, length, WIDTH)))
    tol = float64_tolerance(1e-9, DENSE if value_projection else ())  # the value projection is a Dense
    assert_matches_reference(layer, lambda x: reference(layer, x), x, layer.weights, rtol=tol, atol=tol)


def test_padding_and_decoding_match_reference():
    layer = _layer()
    x = random_normal((2, 50, WIDTH), seed=3)
    mask = np.ones((2, 50), bool)
    mask[1, 4:9] = False
    masked = numpy(layer(x, padding_mask=tensor(mask)))
    np.testing.assert_allclose(masked[mask], numpy(reference(layer, x, mask))[mask], rtol=1e-4, atol=1e-4)
    cache = layer.get_initial_cache(2)
    outs = []
    for start, stop in [(0, 25), (25, 35)] + [(t, t + 1) for t in range(35, 50)]:
        y, cache = layer(x[:, start:stop], padding_mask=tensor(mask[:, start:stop]), cache=cache)
        outs.append(numpy(y))
    np.testing.assert_allclose(np.concatenate(outs, 1)[mask], masked[mask], rtol=1e-5, atol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_heads=0"):
        ShapedAttention(0)
    with pytest.raises(ValueError, match="divisible"):
        ShapedAttention(3)(ops.zeros((1, 2, WIDTH)))
    with pytest.raises(TypeError, match="float inputs"):
        ShapedAttention(2)(ops.zeros((1, 2, WIDTH), "int32"))


def test_compiled_matches_eager():
    layer = _layer()
    x = random_normal((2, 37, WIDTH), seed=5)
    mask = np.ones((2, 37), bool)
    mask[0, 10:14] = False
    mask = tensor(mask)
    np.testing.assert_allclose(
        numpy(compiled(lambda x, m: layer(x, padding_mask=m))(x, mask)),
        numpy(layer(x, padding_mask=mask)),
        rtol=1e-5,
        atol=1e-5,
    )
