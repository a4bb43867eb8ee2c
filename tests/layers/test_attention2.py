import keras
import numpy as np
import pytest
from keras import ops

from elita_tf.layers import Attention2
from elita_tf.ops.reference import attention2_reference
from tests.backend_utils import compiled, numpy, outputs_and_gradients, tensor
from tests.layers.reference_check import assert_matches_reference

WIDTH = 12
WEIGHTS = ["k1", "k2", "k3", "a1", "a2", "b1", "b2", "c", "value_kernel", "output_kernel"]


def _layer(dtype="float32", seed=0, logit_scale=None, **kwargs):
    kwargs = {"num_heads": 3, "head_dim": 5, "position_dim": 4, "position_scale": 64, "chunk_size": 16, **kwargs}
    layer = Attention2(dtype=dtype, **kwargs)
    layer.build((None, None, WIDTH))
    rng = np.random.default_rng(seed)
    for name in WEIGHTS:
        var = getattr(layer, name)
        # Larger than the default init so positions and gates matter.
        scale = 1.0 if name.startswith(("a", "b", "c")) else 0.5
        if logit_scale is not None and name in ("k1", "k2", "k3"):
            scale = logit_scale
        var.assign(rng.normal(size=var.shape) * scale)
    return layer


def _inputs(length, batch=2, seed=1, dtype="float32"):
    return tensor(np.random.default_rng(seed).normal(size=(batch, length, WIDTH)), dtype)


def reference(layer, x, start=0):
    """The layer's output by its definition (docs/math.md §2), in float64, from its own weights."""
    w = {name: ops.cast(getattr(layer, name).value, "float64") for name in WEIGHTS}
    x = ops.cast(x, "float64")
    length = x.shape[1]
    if layer.position_mode == "fixed":
        u = (start + np.arange(length)) / (layer.position_scale - 1)
    elif layer.position_mode == "clamped":
        u = np.minimum(start + np.arange(length), layer.position_scale - 1) / (layer.position_scale - 1)
    else:
        u = np.linspace(0.0, layer.time_scale, length)
    u = tensor(u, "float64")

    def sinusoids(a, b):
        return ops.einsum("hp,hpt->ht", w["c"], ops.sin(a[..., None] * u + b[..., None]))[None]

    kappa = ops.einsum("btd,hd->bht", x, w["k1"]) + sinusoids(w["a1"], w["b1"])
    delta = ops.einsum("btd,hd->bht", x, w["k2"])
    rho = ops.einsum("btd,hd->bht", x, w["k3"]) + sinusoids(w["a2"], w["b2"])
    values = ops.einsum("btd,hde->bhte", x, w["value_kernel"])
    y = attention2_reference(kappa, delta, rho, values, logit_clip=layer.logit_clip)
    return ops.einsum("bhte,hde->btd", y, w["output_kernel"])


@pytest.mark.parametrize("length", [1, 63, 100, 257])
def test_forward_matches_reference(length, choice_form):
    x = _inputs(length)
    layer, layer64 = _layer(), _layer("float64")
    np.testing.assert_allclose(numpy(layer(x)), numpy(reference(layer, x)), rtol=1e-4, atol=1e-4)
    x64 = ops.cast(x, "float64")
    np.testing.assert_allclose(numpy(layer64(x64)), numpy(reference(layer64, x64)), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("length", [1, 100])
def test_the_same_weights_give_the_same_outputs_compiled(length):
    # Compiled, the projections are one product (XLA's and the GPU's form).
    layer = _layer("float64")
    x = _inputs(length, dtype="float64")
    np.testing.assert_allclose(numpy(compiled(layer)(x)), numpy(layer(x)), rtol=1e-10, atol=1e-10)
    _, cache = layer(x[:, :-1], cache=layer.get_initial_cache(2))
    step = compiled(lambda x, cache: layer(x, cache=cache))
    np.testing.assert_allclose(numpy(step(x[:, -1:], cache)[0]), numpy(layer(x)[:, -1:]), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("length", [1, 63, 100, 257])
def test_gradients_match_reference(length, choice_form):
    # "select" takes XLA's and the GPU's forms: the projections as one product and the direct kernel.
    layer = _layer("float64")
    x = _inputs(length, dtype="float64")
    variables = [getattr(layer, n) for n in WEIGHTS]
    assert_matches_reference(layer, lambda x: reference(layer, x), x, variables, rtol=1e-8, atol=1e-8)


def test_large_logits_exact_and_finite():
    # Logits reach +-80: the reference's clip at 20 would change the output.
    layer = _layer(logit_scale=12.0)
    x = _inputs(257)
    y = numpy(layer(x))
    # The gradients of sum(y ** 2): cotangent 2 y.
    _, grads = outputs_and_gradients(layer, [x], [2.0 * y], layer.trainable_weights)
    logits = np.einsum("btd,hd->bht", numpy(x), numpy(layer.k1))
    assert np.abs(logits).max() > 60
    assert all(np.all(np.isfinite(g)) for g in grads)
    np.testing.assert_allclose(y, numpy(reference(layer, x)), rtol=1e-3, atol=1e-3)


def test_logit_clip_reproduces_reference_clipping():
    layer = _layer(logit_scale=12.0, logit_clip=20.0)
    x = _inputs(100)
    want = numpy(reference(layer, x))  # exp(clip(z)) / cumsum, as the original
    np.testing.assert_allclose(numpy(layer(x)), want, rtol=1e-4, atol=1e-4)
    unclipped = numpy(reference(_layer(logit_scale=12.0), x))
    assert np.abs(want - unclipped).max() > 1e-2  # the clip really matters here


def test_length_mode_is_the_reference_linspace():
    layer = _layer(position_mode="length", time_scale=1.5)
    x = _inputs(50)
    np.testing.assert_allclose(numpy(layer(x)), numpy(reference(layer, x)), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="position_mode='fixed'"):
        layer(x, cache=layer.get_initial_cache(2))


def test_fixed_mode_equals_length_mode_at_the_training_length():
    fixed, length = _layer(position_scale=40), _layer(position_mode="length", position_scale=40)
    x = _inputs(40)
    np.testing.assert_allclose(numpy(fixed(x)), numpy(length(x)), rtol=1e-5, atol=1e-6)


def test_clamped_mode_holds_the_last_trained_position():
    fixed, clamped = _layer(position_scale=40), _layer(position_mode="clamped", position_scale=40)
    x = _inputs(100)
    want = numpy(reference(clamped, x))
    y_clamped, y_fixed = numpy(clamped(x)), numpy(fixed(x))
    np.testing.assert_allclose(y_clamped, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y_clamped[:, :40], y_fixed[:, :40], rtol=1e-5, atol=1e-6)  # the same up to L
    assert np.abs(y_clamped[:, 40:] - y_fixed[:, 40:]).max() > 1e-2  # past L the two differ
    # Decoding past L from a cache continues the parallel pass.
    y, cache = clamped(x[:, :70], cache=clamped.get_initial_cache(2))
    steps = [numpy(y)]
    for t in range(70, 100):
        y, cache = clamped(x[:, t : t + 1], cache=cache)
        steps.append(numpy(y))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), want, rtol=1e-4, atol=1e-4)


def test_bad_inputs():
    with pytest.raises(ValueError, match="num_heads=0"):
        Attention2(num_heads=0, head_dim=4, position_dim=2)
    with pytest.raises(ValueError, match="position_mode='relative'"):
        Attention2(num_heads=1, head_dim=4, position_dim=2, position_mode="relative")
    layer = Attention2(num_heads=1, head_dim=4, position_dim=2)
    with pytest.raises(ValueError, match="ndim=3"):
        layer(tensor(np.zeros([4, 8], "float32")))
    layer(tensor(np.zeros([2, 3, 8], "float32")))
    with pytest.raises(ValueError, match="axis -1"):
        layer(tensor(np.zeros([2, 3, 9], "float32")))
    with pytest.raises(TypeError, match="float inputs"):
        Attention2(num_heads=1, head_dim=4, position_dim=2)(tensor(np.zeros([2, 3, 8], "int32")))


def test_trains_with_fit():
    keras.utils.set_random_seed(0)
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(16, 32)(tokens)
    x = x + Attention2(num_heads=4, head_dim=8, position_dim=4, position_scale=24)(x)
    logits = keras.layers.Dense(16)(x)
    model = keras.Model(tokens, logits)
    model.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # Each sequence repeats one token, half of its positions replaced by noise:
    # the majority so far (a causal mean over the history) gives the target.
    rng = np.random.default_rng(0)
    targets = np.repeat(rng.integers(1, 16, size=(256, 1)), 24, axis=1)
    ids = np.where(rng.random(targets.shape) < 0.5, targets, rng.integers(1, 16, size=targets.shape))
    history = model.fit(ids, targets, batch_size=32, epochs=8, verbose=0)
    # Without the attention layer this model plateaus at ~1.9 (measured).
    assert history.history["loss"][-1] < 1.2
