import numpy as np
import pytest
from keras import ops

from elita_tf.layers.additive_attention import AdditiveAttention
from elita_tf.ops.reference import causal_softmax_mean_reference
from tests.backend_utils import compiled, numpy, outputs_and_gradients, tensor
from tests.layers.keras_float64 import DENSE, NORMS, float64_tolerance
from tests.layers.reference_check import assert_matches_reference

WIDTH = 12
HEADS = 3
# Windows: global, inside one kernel chunk (banded), beyond it (blockwise).
WINDOWS = [None, 4, 40]


def _weights(layer):
    return {
        "query": layer.query_dense.kernel,
        "key": layer.key_dense.kernel,
        "value": layer.value_dense.kernel,
        "output": layer.output_dense.kernel,
        "gamma": layer.mid_norm.gamma,
        "beta": layer.mid_norm.beta,
        "query_pooling": layer.query_pooling,
        "key_pooling": layer.key_pooling,
    }


def _layer(dtype="float32", seed=0, pooling_scale=1.0, **kwargs):
    layer = AdditiveAttention(**{"num_heads": HEADS, **kwargs}, dtype=dtype)
    layer.build((None, None, WIDTH))
    rng = np.random.default_rng(seed)
    # Far from the init (zero pooling vectors, 0.02 kernels) so every logit matters.
    scales = {"gamma": 0.3, "beta": 0.3, "query_pooling": pooling_scale, "key_pooling": pooling_scale}
    for name, var in _weights(layer).items():
        value = rng.normal(size=var.shape) * scales.get(name, 0.5)
        var.assign(value + 1.0 if name == "gamma" else value)
    return layer


def _inputs(length, batch=2, seed=1, dtype="float32"):
    return tensor(np.random.default_rng(seed).normal(size=(batch, length, WIDTH)), dtype)


def reference(layer, x, mask=None, logits=None):
    """The layer's output by its definition (docs/math.md §7, update only), in float64, from its own weights.

    With a list `logits`, the two poolings' logits `[B, H, T]` are appended to it.
    """
    w = {name: ops.cast(v.value, "float64") for name, v in _weights(layer).items()}
    x = ops.cast(x, "float64")
    batch, length = x.shape[0], x.shape[1]
    heads, head_dim = layer.num_heads, WIDTH // layer.num_heads

    def pool(z, vector):
        z = ops.transpose(ops.reshape(z, [batch, length, heads, head_dim]), [0, 2, 1, 3])
        scores = ops.einsum("bhte,he->bht", z, ops.reshape(vector, [heads, head_dim])) / np.sqrt(head_dim)
        if logits is not None:
            logits.append(scores)
        mean, _ = causal_softmax_mean_reference(scores, z, window=layer.sliding_window_size, mask=mask)
        return ops.reshape(ops.transpose(mean, [0, 2, 1, 3]), [batch, length, WIDTH])

    q, kappa, v = (ops.einsum("btd,de->bte", x, w[n]) for n in ("query", "key", "value"))
    mixed = ops.einsum("btd,de->bte", pool(q, w["query_pooling"]), w["output"]) * kappa
    r = x + mixed
    mu = ops.mean(r, axis=-1, keepdims=True)
    var = ops.mean((r - mu) ** 2, axis=-1, keepdims=True)
    m = (r - mu) / ops.sqrt(var + layer.layer_norm_epsilon) * w["gamma"] + w["beta"]
    return mixed + pool(m, w["key_pooling"]) * v


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("length", [1, 63, 100, 257])
def test_outputs_and_gradients_match_reference(length, window):
    layer = _layer("float64", sliding_window_size=window)
    x = _inputs(length, dtype="float64")
    variables = list(_weights(layer).values())
    tol = float64_tolerance(1e-8, DENSE, NORMS, float32=1e-4)  # Dense projections, Keras' LayerNormalization
    assert_matches_reference(layer, lambda x: reference(layer, x), x, variables, rtol=tol, atol=tol)

    layer32 = _layer(sliding_window_size=window)
    x32 = ops.cast(x, "float32")
    np.testing.assert_allclose(numpy(layer32(x32)), numpy(reference(layer32, x32)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", WINDOWS)
def test_the_same_weights_give_the_same_outputs_compiled(window):
    layer = _layer("float64", sliding_window_size=window)
    x = _inputs(100, dtype="float64")
    tol = float64_tolerance(1e-10, DENSE)  # Dense's float32 rounds differently compiled
    np.testing.assert_allclose(numpy(compiled(layer)(x)), numpy(layer(x)), rtol=tol, atol=tol)


@pytest.mark.parametrize("window", [None, 40])
def test_large_logits_exact_and_finite(window):
    layer = _layer(sliding_window_size=window)
    x = _inputs(257)
    # Scale w_q, then w_k (whose input depends on w_q), to logits of exactly +-80 at most.
    for index, var in enumerate([layer.query_pooling, layer.key_pooling]):
        logits = []
        reference(layer, x, logits=logits)
        var.assign(numpy(var) * (80.0 / np.abs(numpy(logits[index])).max()))
    logits = []
    reference(layer, x, logits=logits)
    np.testing.assert_allclose([np.abs(numpy(s)).max() for s in logits], [80.0, 80.0], rtol=1e-5)
    y = numpy(layer(x))
    # The gradients of sum(y ** 2): cotangent 2 y.
    _, grads = outputs_and_gradients(layer, [x], [2.0 * y], layer.trainable_weights)
    assert np.all(np.isfinite(y)) and all(np.all(np.isfinite(g)) for g in grads)
    np.testing.assert_allclose(y, numpy(reference(layer, x)), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("window", [None, 4])
def test_padding_mask_keeps_padded_inputs_out(window):
    layer = _layer(sliding_window_size=window)
    x = _inputs(60)
    mask = np.ones((2, 60), bool)
    mask[0, 20:30] = False
    mask[1, :3] = False
    noisy = tensor(np.where(mask[..., None], numpy(x), np.float32(100.0)))
    y, y_noisy = numpy(layer(x, padding_mask=mask)), numpy(layer(noisy, padding_mask=mask))
    np.testing.assert_allclose(y[mask], y_noisy[mask], rtol=1e-5, atol=1e-5)
    want = numpy(reference(layer, x, tensor(mask)))
    np.testing.assert_allclose(y[mask], want[mask], rtol=1e-4, atol=1e-4)
    assert np.all(np.isfinite(y))
    # Decoding with the mask gives the same outputs at real positions.
    cache = layer.get_initial_cache(2)
    outputs = []
    for start, stop in [(0, 25)] + [(t, t + 1) for t in range(25, 35)] + [(35, 60)]:
        out, cache = layer(noisy[:, start:stop], padding_mask=mask[:, start:stop], cache=cache)
        outputs.append(numpy(out))
    decoded = np.concatenate(outputs, 1)
    np.testing.assert_allclose(decoded[mask], y[mask], rtol=1e-5, atol=1e-5)


def test_initialization():
    layer = AdditiveAttention(num_heads=2)
    layer.build((None, None, 64))
    np.testing.assert_array_equal(numpy(layer.query_pooling), np.zeros(64))
    np.testing.assert_array_equal(numpy(layer.key_pooling), np.zeros(64))
    kernels = [layer.query_dense.kernel, layer.key_dense.kernel, layer.value_dense.kernel, layer.output_dense.kernel]
    kernels = [numpy(kernel) for kernel in kernels]
    for kernel in kernels:
        assert 0.015 < np.std(kernel) < 0.025
    # Each projection gets its own draw of the shared initializer.
    assert len({kernel.tobytes() for kernel in kernels}) == 4


def test_dropout_only_in_training():
    layer = _layer(dropout=0.5)
    x = _inputs(20)
    np.testing.assert_array_equal(numpy(layer(x)), numpy(layer(x, training=False)))
    assert np.abs(numpy(layer(x, training=True)) - numpy(layer(x))).max() > 1e-3


def test_bad_inputs():
    with pytest.raises(ValueError, match="num_heads=0"):
        AdditiveAttention(num_heads=0)
    with pytest.raises(ValueError, match="sliding_window_size=0"):
        AdditiveAttention(num_heads=2, sliding_window_size=0)
    with pytest.raises(ValueError, match="sliding_window_size=2.5"):
        AdditiveAttention(num_heads=2, sliding_window_size=2.5)
    with pytest.raises(ValueError, match="dropout=1.0"):
        AdditiveAttention(num_heads=2, dropout=1.0)
    with pytest.raises(ValueError, match="width=10, num_heads=3"):
        AdditiveAttention(num_heads=3)(tensor(np.zeros([2, 3, 10], "float32")))
    with pytest.raises(TypeError, match="float inputs"):
        AdditiveAttention(num_heads=2)(tensor(np.zeros([2, 3, 8], "int32")))
    with pytest.raises(ValueError, match="must be built"):
        AdditiveAttention(num_heads=2).get_initial_cache(2)
    layer = AdditiveAttention(num_heads=2)
    with pytest.raises(ValueError, match="ndim=3"):
        layer(tensor(np.zeros([4, 8], "float32")))
    layer(tensor(np.zeros([2, 3, 8], "float32")))
    with pytest.raises(ValueError, match="axis -1"):
        layer(tensor(np.zeros([2, 3, 10], "float32")))
