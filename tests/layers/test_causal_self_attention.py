import numpy as np
import pytest
from keras import ops

from elita_tf.layers import CausalSelfAttention
from tests.backend_utils import BACKEND, compiled, numpy, random_normal, tensor
from tests.layers.keras_float64 import MULTI_HEAD_ATTENTION, float64_tolerance
from tests.layers.reference_check import assert_matches_reference

WIDTH = 8
# A check that fails at run time: raised eagerly on JAX and PyTorch, by the graph on TensorFlow.
if BACKEND == "tensorflow":
    import tensorflow as tf

    RUN_TIME_ERRORS = (ValueError, tf.errors.InvalidArgumentError)
else:
    RUN_TIME_ERRORS = ValueError


def _layer(dtype="float32", **kwargs):
    layer = CausalSelfAttention(**{"num_heads": 2, "max_sequence_length": 300, **kwargs}, dtype=dtype)
    layer.build((None, None, WIDTH))
    rng = np.random.default_rng(0)
    for var in layer.weights:
        var.assign(rng.normal(size=var.shape) * 0.4)
    return layer


def reference(layer, x, mask=None):
    """Softmax attention by its definition, in float64, from the layer's own weights (in its window, if any)."""
    w = lambda v: ops.cast(v.value, "float64")  # noqa: E731
    x = ops.cast(x, "float64")

    def dense(t, sub, equation):
        return ops.einsum(equation, t, w(sub.kernel)) + w(sub.bias)

    att = layer.attention
    q, k, v = (dense(x, d, "btd,dhe->bthe") for d in (att.query_dense, att.key_dense, att.value_dense))
    length = x.shape[1]
    visible = np.tril(np.ones((length, length), bool))[None, None]
    if layer.sliding_window_size is not None:  # key s within the window of query t: t - s < W
        visible = visible & ~np.tril(np.ones((length, length), bool), -layer.sliding_window_size)[None, None]
    if mask is not None:
        visible = visible & np.asarray(mask, bool)[:, None, None, :]
    scores = ops.einsum("bthe,bshe->bhts", q, k) / np.sqrt(q.shape[-1])
    weights = ops.softmax(ops.where(visible, scores, -1e300), axis=-1)
    return dense(ops.einsum("bhts,bshe->bthe", weights, v), att.output_dense, "bthe,hed->btd")


@pytest.mark.parametrize("length", [1, 63, 100, 257])
def test_outputs_and_gradients_match_reference(length):
    layer = _layer("float64")
    x = tensor(np.random.default_rng(1).normal(size=(2, length, WIDTH)))
    tol = float64_tolerance(1e-8, MULTI_HEAD_ATTENTION)
    assert_matches_reference(layer, lambda x: reference(layer, x), x, layer.weights, rtol=tol, atol=tol)


@pytest.mark.parametrize("window", [1, 8])
def test_a_sliding_window_matches_its_reference_in_training_and_decoding(window):
    layer = _layer("float64", sliding_window_size=window)
    x = tensor(np.random.default_rng(1).normal(size=(2, 40, WIDTH)))
    tol = float64_tolerance(1e-8, MULTI_HEAD_ATTENTION)
    assert_matches_reference(layer, lambda x: reference(layer, x), x, layer.weights, rtol=tol, atol=tol)
    global_layer = _layer("float64")
    assert not np.allclose(numpy(global_layer(x))[:, window:], numpy(layer(x))[:, window:])  # the window matters
    np.testing.assert_allclose(numpy(global_layer(x))[:, :window], numpy(layer(x))[:, :window], rtol=1e-12)
    cache, outputs = layer.get_initial_cache(2), []
    for start, stop in [(0, 13)] + [(t, t + 1) for t in range(13, 40)]:  # a prefill past the window, then steps
        y, cache = layer(x[:, start:stop], cache=cache)
        outputs.append(numpy(y))
    np.testing.assert_allclose(np.concatenate(outputs, 1), numpy(reference(layer, x)), rtol=1e-10, atol=1e-10)


def test_padding_and_decoding_match_reference():
    layer = _layer()
    x = random_normal((2, 60, WIDTH), seed=1)
    mask = np.ones((2, 60), bool)
    mask[0, 3:8] = False
    want = numpy(reference(layer, x, mask))[mask]
    np.testing.assert_allclose(numpy(layer(x, padding_mask=tensor(mask)))[mask], want, rtol=1e-4, atol=1e-4)
    cache, outputs = layer.get_initial_cache(2), []
    for start, stop in [(0, 35)] + [(t, t + 1) for t in range(35, 60)]:
        y, cache = layer(x[:, start:stop], padding_mask=tensor(mask[:, start:stop]), cache=cache)
        outputs.append(numpy(y))
    np.testing.assert_allclose(np.concatenate(outputs, 1)[mask], want, rtol=1e-4, atol=1e-4)
    assert tuple(cache["key"].shape) == (2, 300, 2, 4)


def test_arguments_and_a_full_cache_are_errors():
    with pytest.raises(ValueError, match="num_heads=0"):
        CausalSelfAttention(0)
    with pytest.raises(ValueError, match="dropout=1.5"):
        CausalSelfAttention(2, dropout=1.5)
    with pytest.raises(ValueError, match="sliding_window_size=0"):
        CausalSelfAttention(2, sliding_window_size=0)
    layer = CausalSelfAttention(2, max_sequence_length=4)
    with pytest.raises(ValueError, match="build or call it"):
        layer.get_initial_cache(1)
    layer.build((None, None, WIDTH))
    _, cache = layer(ops.zeros((1, 3, WIDTH)), cache=layer.get_initial_cache(1))
    with pytest.raises(RUN_TIME_ERRORS, match="is full"):
        layer(ops.zeros((1, 2, WIDTH)), cache=cache)


@pytest.mark.tf_only
def test_the_causal_mask_is_built_by_comparing_positions():
    import tensorflow as tf

    # Keras' `use_causal_mask` sums columns of ones; XLA constant-folds that sum element by element,
    # which stalled the Transformer's compilation for minutes at T = 2048.
    graph = tf.function(_layer()).get_concrete_function(tf.TensorSpec([2, 64, WIDTH])).graph
    operations = {op.type for op in graph.get_operations()}
    assert "Cumsum" not in operations and "LessEqual" in operations


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
