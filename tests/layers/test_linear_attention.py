import numpy as np
import pytest
from keras import ops

from elita_tf.layers import LinearAttention
from elita_tf.ops.reference import causal_linear_attention_reference
from tests.backend_utils import compiled, numpy, tensor
from tests.layers.reference_check import assert_matches_reference

WIDTH = 10


def _layer(dtype="float32", **kwargs):
    layer = LinearAttention(**{"num_heads": 2, "head_dim": 4, "chunk_size": 16, **kwargs}, dtype=dtype)
    layer.build((None, None, WIDTH))
    rng = np.random.default_rng(0)
    for var in layer.weights:
        var.assign(rng.normal(size=var.shape) * 0.5)
    return layer


def reference(layer, x):
    """Projections, elu+1 features and the O(T^2) definition, in float64."""
    w = {v.path.split("/")[-2] + "/" + v.path.split("/")[-1]: ops.cast(v.value, "float64") for v in layer.weights}
    x = ops.cast(x, "float64")
    proj = lambda n: ops.einsum("btd,dhe->bhte", x, w[f"{n}/kernel"]) + w[f"{n}/bias"][:, None]  # noqa: E731
    phi = lambda t: ops.elu(t) + 1.0  # noqa: E731
    y = causal_linear_attention_reference(phi(proj("query")), phi(proj("key")), proj("value"), epsilon=layer.epsilon)
    return ops.einsum("bhte,hed->btd", y, w["output/kernel"]) + w["output/bias"]


@pytest.mark.parametrize("length", [1, 63, 100, 257])
def test_outputs_and_gradients_match_reference(length):
    layer = _layer("float64")
    x = tensor(np.random.default_rng(1).normal(size=(2, length, WIDTH)))
    assert_matches_reference(layer, lambda x: reference(layer, x), x, layer.weights, rtol=1e-9, atol=1e-9)


def test_the_same_weights_give_the_same_outputs_compiled():
    layer = _layer("float64")
    x = tensor(np.random.default_rng(1).normal(size=(2, 100, WIDTH)))
    np.testing.assert_allclose(numpy(compiled(layer)(x)), numpy(layer(x)), rtol=1e-10, atol=1e-10)


def test_bad_inputs():
    with pytest.raises(ValueError, match="num_heads=0"):
        LinearAttention(0, 4)
    with pytest.raises(ValueError, match="feature_map='softmax'"):
        LinearAttention(1, 4, feature_map="softmax")
    with pytest.raises(TypeError, match="float inputs"):
        LinearAttention(1, 4)(tensor(np.zeros([1, 3, 4], "int32")))
    layer = LinearAttention(1, 4)
    layer(tensor(np.zeros([1, 3, 4], "float32")))
    with pytest.raises(ValueError, match="axis -1"):
        layer(tensor(np.zeros([1, 3, 5], "float32")))
    assert tuple(layer(tensor(np.zeros([1, 0, 4], "float32"))).shape) == (1, 0, 4)
