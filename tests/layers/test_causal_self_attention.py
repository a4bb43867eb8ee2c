import numpy as np
import pytest
import tensorflow as tf

from elita_tf.layers import CausalSelfAttention
from tests.layers.reference_check import assert_matches_reference

WIDTH = 8


def _layer(dtype="float32", **kwargs):
    layer = CausalSelfAttention(**{"num_heads": 2, "max_sequence_length": 300, **kwargs}, dtype=dtype)
    layer.build((None, None, WIDTH))
    rng = np.random.default_rng(0)
    for var in layer.weights:
        var.assign(rng.normal(size=var.shape) * 0.4)
    return layer


def reference(layer, x, mask=None):
    """Softmax attention by its definition, in float64, from the layer's own weights."""
    w = lambda v: tf.cast(tf.convert_to_tensor(v), tf.float64)  # noqa: E731
    x = tf.cast(x, tf.float64)

    def dense(t, sub, equation):
        return tf.einsum(equation, t, w(sub.kernel)) + w(sub.bias)

    att = layer.attention
    q, k, v = (dense(x, d, "btd,dhe->bthe") for d in (att.query_dense, att.key_dense, att.value_dense))
    length = x.shape[1]
    visible = np.tril(np.ones((length, length), bool))[None, None]
    if mask is not None:
        visible = visible & np.asarray(mask, bool)[:, None, None, :]
    scores = tf.einsum("bthe,bshe->bhts", q, k) / np.sqrt(q.shape[-1])
    weights = tf.nn.softmax(tf.where(visible, scores, -1e300), axis=-1)
    return dense(tf.einsum("bhts,bshe->bthe", weights, v), att.output_dense, "bthe,hed->btd")


@pytest.mark.parametrize("length", [1, 63, 100, 257])
def test_outputs_and_gradients_match_reference(length):
    layer = _layer("float64")
    x = tf.constant(np.random.default_rng(1).normal(size=(2, length, WIDTH)))
    assert_matches_reference(layer, lambda x: reference(layer, x), x, layer.weights, rtol=1e-8, atol=1e-8)


def test_padding_and_decoding_match_reference():
    layer = _layer()
    x = tf.random.stateless_normal([2, 60, WIDTH], seed=[1, 2])
    mask = np.ones((2, 60), bool)
    mask[0, 3:8] = False
    want = reference(layer, x, mask).numpy()[mask]
    np.testing.assert_allclose(layer(x, padding_mask=mask).numpy()[mask], want, rtol=1e-4, atol=1e-4)
    cache, outputs = layer.get_initial_cache(2), []
    for start, stop in [(0, 35)] + [(t, t + 1) for t in range(35, 60)]:
        y, cache = layer(x[:, start:stop], padding_mask=mask[:, start:stop], cache=cache)
        outputs.append(y)
    np.testing.assert_allclose(tf.concat(outputs, 1).numpy()[mask], want, rtol=1e-4, atol=1e-4)
    assert cache["key"].shape == (2, 300, 2, 4)


def test_arguments_and_a_full_cache_are_errors():
    with pytest.raises(ValueError, match="num_heads=0"):
        CausalSelfAttention(0)
    with pytest.raises(ValueError, match="dropout=1.5"):
        CausalSelfAttention(2, dropout=1.5)
    layer = CausalSelfAttention(2, max_sequence_length=4)
    with pytest.raises(ValueError, match="build or call it"):
        layer.get_initial_cache(1)
    layer.build((None, None, WIDTH))
    _, cache = layer(tf.zeros([1, 3, WIDTH]), cache=layer.get_initial_cache(1))
    with pytest.raises(tf.errors.InvalidArgumentError, match="is full"):
        layer(tf.zeros([1, 2, WIDTH]), cache=cache)


def test_the_causal_mask_is_built_by_comparing_positions():
    # Keras' `use_causal_mask` sums columns of ones; XLA constant-folds that sum element by element,
    # which stalled the Transformer's compilation for minutes at T = 2048.
    graph = tf.function(_layer()).get_concrete_function(tf.TensorSpec([2, 64, WIDTH])).graph
    operations = {op.type for op in graph.get_operations()}
    assert "Cumsum" not in operations and "LessEqual" in operations
