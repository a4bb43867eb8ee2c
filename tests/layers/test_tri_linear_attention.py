import math

import keras
import numpy as np
import pytest
from keras import ops

from elita_tf.layers.tri_linear_attention import TriLinearAttention
from elita_tf.models.decoder_layers import alibi_v1
from tests.backend_utils import BACKEND, compiled, numpy, outputs_and_gradients, tensor
from tests.layers.keras_float64 import DENSE, float64_tolerance
from tests.layers.reference_check import assert_matches_reference

WIDTH = 12
WEIGHTS = ["query_key_kernel", "query_value_kernel", "key_kernel", "value_kernel", "combiner_kernel"]
NARROW = {"sliding_window_size": 5, "slope": 0.25, "hyper": 6.0}
# A check that fails at run time: raised eagerly on JAX and PyTorch, by the graph on TensorFlow.
if BACKEND == "tensorflow":
    import tensorflow as tf

    RUN_TIME_ERRORS = (ValueError, tf.errors.InvalidArgumentError)
else:
    RUN_TIME_ERRORS = ValueError


def _layer(dtype="float32", seed=0, **kwargs):
    kwargs = {"query_dim": 8, "lowrank_dim": 16, "chunk_size": 16, "max_sequence_length": 128, **kwargs}
    layer = TriLinearAttention(dtype=dtype, **kwargs)
    layer.build((None, None, WIDTH))
    rng = np.random.default_rng(seed)
    for name in WEIGHTS:
        var = getattr(layer, name)
        # N(0, 1/dim) as the default, but a non-zero Combiner and a larger
        # query scale so that the logits span several nats.
        scale = {"query_value_kernel": 3.0, "combiner_kernel": 4.0}.get(name, 1.0) / math.sqrt(WIDTH)
        var.assign(rng.normal(size=var.shape) * scale)
    return layer


def _inputs(length, batch=2, seed=1, dtype="float32"):
    return tensor(np.random.default_rng(seed).normal(size=(batch, length, WIDTH)) * 2.0, dtype)


def reference(layer, s, mask=None):
    """The layer's update by its definition (docs/math.md §6: base-2 logits, dense Combiner), float64, from its
    own weights."""
    w = {name: ops.cast(getattr(layer, name).value, "float64") for name in WEIGHTS}
    s = ops.cast(s, "float64")

    def norm(x):
        length = ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True))  # `ops.norm` is float32 on JAX
        return ops.where(length > 0, x * math.sqrt(x.shape[-1]) / length, 0.0)

    x = norm(s)
    qk, qv = norm(x @ w["query_key_kernel"]), x @ w["query_value_kernel"]
    k, v = norm(x @ w["key_kernel"]), norm(x @ w["value_kernel"])
    length = s.shape[1]
    t, j = np.arange(length)[:, None], np.arange(length)[None, :]
    if layer.wide:
        span = j <= t - 1
    else:
        # Span(t) = {j : max(0, t - w + 1) <= j <= t - 1} ∪ {0 if t - w + 1 > 0}
        span = (j >= np.maximum(0, t - layer.sliding_window_size + 1)) & (j <= t - 1) | (
            (j == 0) & (t - layer.sliding_window_size + 1 > 0)
        )
    span = np.broadcast_to(span, (s.shape[0], length, length))
    if mask is not None:
        span = span & np.asarray(mask)[:, None, :]
    distance = np.maximum(t - j, 1)
    bits = ops.einsum("btq,bjq->btj", qk, qv) / (math.sqrt(layer.query_dim) * math.log(2))
    bits += tensor(-layer.slope * distance + layer.hyper / distance, "float64")
    p = ops.where(span, ops.power(ops.cast(2.0, "float64"), ops.where(span, bits, 0.0)), 0.0)
    att = ops.einsum("btj,bjk->btk", p, v) / (1.0 + ops.sum(p, -1, keepdims=True))
    # Dense trilinear tensor: T3[a, c, z] = W_C[b tt + a, z] with c = a xor b (a 0/1 selection of the rows).
    tt = layer.lowrank_dim
    select = np.zeros((tt, tt, 16 * tt))
    for b in range(16):
        for a in range(tt):
            select[a, a ^ b, b * tt + a] = 1.0
    dense = ops.einsum("acr,rz->acz", tensor(select), w["combiner_kernel"])
    return ops.einsum("bta,btc,acz->btz", att, k, dense)


@pytest.mark.parametrize("length", [1, 63, 100, 257])
@pytest.mark.parametrize("kind", [NARROW, {"sliding_window_size": 40, "hyper": 13.3}, {"wide": True}])
def test_forward_matches_reference(length, kind):
    x = _inputs(length)
    layer, layer64 = _layer(**kind), _layer("float64", **kind)
    want = numpy(reference(layer, x))
    assert np.abs(want).max() > 0.5 or length == 1  # row 0 sees only the null slot
    np.testing.assert_allclose(numpy(layer(x)), want, rtol=1e-4, atol=1e-4)
    x64 = ops.cast(x, "float64")
    tol = float64_tolerance(1e-10, DENSE, float32=1e-4)  # as the float32 layer's check above
    np.testing.assert_allclose(numpy(layer64(x64)), numpy(reference(layer64, x64)), rtol=tol, atol=tol)


@pytest.mark.parametrize("length", [1, 63, 100, 257])
@pytest.mark.parametrize("kind", [NARROW, {"wide": True}])
def test_gradients_match_reference(length, kind):
    layer = _layer("float64", **kind)
    x = _inputs(length, dtype="float64")
    variables = [getattr(layer, n) for n in WEIGHTS]
    # Where Keras' Dense is float32, logits spanning several nats carry its round-off: the float32 check's 1e-4.
    rtol, atol = float64_tolerance(1e-8, DENSE, float32=1e-4), float64_tolerance(1e-9, DENSE, float32=1e-4)
    assert_matches_reference(layer, lambda x: reference(layer, x), x, variables, rtol=rtol, atol=atol)


def test_alibi_v1_matches_the_spec_table():
    table = {  # k mod 6: (slope, hyper, wide), the Alibi V1 table
        0: (0.0, 20 / 3, False),
        1: (0.0, 0.0, True),
        2: (0.0, 40 / 3, False),
        3: (0.25, 0.0, False),
        4: (0.0, 20.0, False),
        5: (0.5, 0.0, False),
    }
    for k in range(18):
        np.testing.assert_allclose(alibi_v1(k), table[k % 6], rtol=1e-12)
    assert [k for k in range(14) if alibi_v1(k)[2]] == [1, 7, 13]
    with pytest.raises(ValueError, match="layer_index=-1"):
        alibi_v1(-1)


def test_default_init():
    layer = TriLinearAttention(query_dim=32, lowrank_dim=32)
    x = _inputs(10, seed=3)
    x = ops.concatenate([x] * 20, axis=-1)  # dim = 240
    np.testing.assert_array_equal(numpy(layer(x)), 0.0)  # zero Combiner: the identity of the residual stream
    for name in WEIGHTS[:4]:
        std = np.std(numpy(getattr(layer, name)))
        assert abs(std * math.sqrt(240) - 1.0) < 0.1, (name, std)


def test_zero_state_stays_finite():
    layer = _layer(**NARROW)
    x = ops.concatenate([ops.zeros((2, 3, WIDTH)), _inputs(5)], axis=1)
    (y,), (grad,) = outputs_and_gradients(layer, [x], [np.ones((2, 8, WIDTH))])
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(grad))
    np.testing.assert_allclose(y, numpy(reference(layer, x)), rtol=1e-4, atol=1e-4)


def test_decode_from_the_first_token():
    layer = _layer(**NARROW)
    x = _inputs(12)
    full = numpy(layer(x))
    cache = layer.get_initial_cache(2)
    for t in range(12):
        y, cache = layer(x[:, t : t + 1], cache=cache)
        np.testing.assert_allclose(numpy(y)[:, 0], full[:, t], rtol=1e-5, atol=1e-5)


def test_wide_cache_overflow_is_an_error():
    layer = _layer(wide=True, max_sequence_length=8)
    with pytest.raises(RUN_TIME_ERRORS, match="fewer positions"):
        layer(_inputs(9), cache=layer.get_initial_cache(2))


@pytest.mark.parametrize("kind", [NARROW, {"wide": True}])
def test_padding_mask_keeps_padded_inputs_out(kind):
    layer = _layer(**kind)
    x = _inputs(60)
    mask = np.ones((2, 60), bool)
    mask[0, 20:30] = False
    mask[1, 0] = False  # the start position is padding
    noisy = ops.where(tensor(mask)[..., None], x, 100.0)
    mask_t = tensor(mask)
    y, y_noisy = numpy(layer(x, padding_mask=mask_t)), numpy(layer(noisy, padding_mask=mask_t))
    np.testing.assert_allclose(y[mask], y_noisy[mask], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, numpy(reference(layer, x, mask)), rtol=1e-4, atol=1e-4)


def test_bad_inputs():
    with pytest.raises(ValueError, match="multiple of 16.*Received: lowrank_dim=20"):
        TriLinearAttention(lowrank_dim=20)
    with pytest.raises(ValueError, match="Received: sliding_window_size=1"):
        TriLinearAttention(sliding_window_size=1)
    with pytest.raises(ValueError, match="Received: query_dim=0"):
        TriLinearAttention(query_dim=0)
    with pytest.raises(ValueError, match="Received: slope=nan"):
        TriLinearAttention(slope=float("nan"))
    layer = TriLinearAttention(query_dim=4, lowrank_dim=16, sliding_window_size=4)
    with pytest.raises(ValueError, match="ndim=3"):
        layer(ops.zeros((4, 8)))
    layer(ops.zeros((2, 3, 8)))
    with pytest.raises(ValueError, match="axis -1"):
        layer(ops.zeros((2, 3, 9)))
    with pytest.raises(TypeError, match="float inputs"):
        TriLinearAttention(query_dim=4, lowrank_dim=16)(ops.zeros((2, 3, 8), "int32"))


def test_trains_with_fit():
    # Target: the previous token. Only the distance bias tells positions apart
    # (hyper / Δ: +20 bits at Δ = 1); without attention the best loss is
    # log(8) ≈ 2.08, and row 0 alone keeps it above 2.08 / 16 ≈ 0.13.
    keras.utils.set_random_seed(0)
    tokens = keras.Input((None,), dtype="int32")
    s = keras.layers.Embedding(8, 32)(tokens)
    s = s + TriLinearAttention(query_dim=16, lowrank_dim=16, sliding_window_size=4, hyper=20.0)(s)  # zero Combiner
    model = keras.Model(tokens, keras.layers.Dense(8)(s))
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ids = np.random.default_rng(0).integers(0, 8, size=(256, 17))
    history = model.fit(ids[:, 1:], ids[:, :-1], batch_size=32, epochs=3, verbose=0)
    assert history.history["loss"][-1] < 0.2


@pytest.mark.parametrize("kind", [NARROW, {"wide": True}])
def test_compiled_matches_eager(kind):
    layer = _layer(**kind)
    x = _inputs(37)
    mask = np.ones((2, 37), bool)
    mask[1, 5:9] = False
    mask = tensor(mask)
    np.testing.assert_allclose(
        numpy(compiled(lambda x, m: layer(x, padding_mask=m))(x, mask)),
        numpy(layer(x, padding_mask=mask)),
        rtol=1e-5,
        atol=1e-5,
    )
