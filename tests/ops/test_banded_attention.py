import numpy as np
import pytest
from keras import ops

from elita_tf.ops.banded_attention import banded_attention, empty_banded_state
from elita_tf.ops.banded_attention_step import banded_attention_step
from elita_tf.ops.reference import banded_attention_reference
from elita_tf.ops.utils.dtypes import dtype_of
from tests.backend_utils import BACKEND, compiled, numpy, outputs_and_gradients, tensor
from tests.ops.low_precision import assert_low_precision_follows_float32

LENGTHS = [1, 63, 100, 257]
# Smaller and larger than the chunk (16 in these tests, 32 by default); None is "wide".
WINDOWS = [None, 2, 5, 16, 40, 300]
CHUNK = 16
BIAS = {"slope": 0.3, "hyper": 2.5}


def _check_error():
    """What `elita_tf.backend.check_less_equal` raises on this backend."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.errors.InvalidArgumentError
    return ValueError


_CHECK_ERROR = _check_error()


def _inputs(length, batch=2, heads=2, key_dim=4, value_dim=3, scale=1.0, seed=0, dtype="float64"):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, heads, length, key_dim)) * scale
    k = rng.normal(size=(batch, heads, length, key_dim))
    v = rng.normal(size=(batch, heads, length, value_dim))
    return tuple(tensor(x, dtype) for x in (q, k, v))


def _assert_finite(*arrays):
    for t in arrays:
        assert np.all(np.isfinite(numpy(t))), "non-finite values"


def _grads(fn, inputs, cotangent):
    """`[out, d q, d k, d v]` of `sum(fn(q, k, v) * cotangent)`, as NumPy arrays."""
    (out,), grads = outputs_and_gradients(fn, list(inputs), cotangent)
    return [out] + grads


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("window", WINDOWS)
def test_forward_matches_reference_float64(length, window):
    q, k, v = _inputs(length)
    out, _ = banded_attention(q, k, v, window=window, chunk_size=CHUNK, **BIAS)
    ref = banded_attention_reference(q, k, v, window=window, **BIAS)
    assert dtype_of(out) == "float64"
    np.testing.assert_allclose(numpy(out), numpy(ref), rtol=1e-10, atol=1e-12)
    # Row 0 sees only the null slot.
    np.testing.assert_array_equal(numpy(out)[:, :, 0], 0.0)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("window", [None, 5, 40])
def test_gradients_match_reference(length, window):
    q, k, v = _inputs(length, seed=1)
    cotangent = np.random.default_rng(2).normal(size=v.shape)

    got = _grads(lambda q, k, v: banded_attention(q, k, v, window=window, chunk_size=CHUNK, **BIAS)[0], (q, k, v), cotangent)
    want = _grads(lambda q, k, v: banded_attention_reference(q, k, v, window=window, **BIAS), (q, k, v), cotangent)
    for g, w in zip(got[1:], want[1:]):
        _assert_finite(g)
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("window", [None, 2, 5, 40])
def test_packed_documents_match_the_reference_and_each_document_alone(window):
    """With `document_starts`, each document has its own start position and its own distances, in outputs and gradients."""
    q, k, v = _inputs(75, seed=4)
    document_starts = np.zeros((2, 75), bool)
    document_starts[0, [0, 9, 10, 33, 60]] = True  # a one-token document at 9
    document_starts[1, [17, 40]] = True
    mask = np.ones((2, 75), bool)
    mask[1, [20, 40]] = False  # padding, one of it on a document's first position
    cotangent = np.random.default_rng(2).normal(size=v.shape)
    mask_t, starts_t = tensor(mask), tensor(document_starts)

    packed = _grads(
        lambda q, k, v: banded_attention(
            q, k, v, window=window, mask=mask_t, document_starts=starts_t, chunk_size=CHUNK, **BIAS
        )[0],
        (q, k, v),
        cotangent,
    )
    want = _grads(
        lambda q, k, v: banded_attention_reference(
            q, k, v, window=window, mask=mask_t, document_starts=starts_t, **BIAS
        ),
        (q, k, v),
        cotangent,
    )
    for got, expected in zip(packed, want):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-10)
    for row in range(2):
        bounds = sorted({0, *np.flatnonzero(document_starts[row])}) + [75]
        for a, b in zip(bounds[:-1], bounds[1:]):
            alone, _ = banded_attention(
                *(x[row : row + 1, :, a:b] for x in (q, k, v)),
                window=window,
                mask=tensor(mask[row : row + 1, a:b]),
                chunk_size=CHUNK,
                **BIAS,
            )
            np.testing.assert_allclose(packed[0][row : row + 1, :, a:b], numpy(alone), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="do not continue an `initial_state`"):
        banded_attention(
            q, k, v, window=window, document_starts=starts_t, initial_state=empty_banded_state(2, 2, 4, 3, 8, 80)
        )


def test_numeric_gradient_check():
    """The gradient of `sum(out * c)` against central differences, every input entry, in float64 on every backend."""
    q, k, v = _inputs(13, batch=1, heads=1, key_dim=2, value_dim=2, seed=3)
    cotangent = np.random.default_rng(4).normal(size=v.shape)
    arrays = [numpy(x) for x in (q, k, v)]
    for window in [None, 3, 8]:

        def fn(q, k, v):
            return banded_attention(q, k, v, window=window, chunk_size=4, **BIAS)[0]

        def loss(*xs):
            return float(np.sum(numpy(fn(*(tensor(x) for x in xs))) * cotangent))

        _, theory = outputs_and_gradients(fn, [q, k, v], cotangent)
        step = 1e-6
        for n, (x, t) in enumerate(zip(arrays, theory)):
            numeric = np.zeros_like(x)
            for at in np.ndindex(x.shape):
                up, down = [a.copy() for a in arrays], [a.copy() for a in arrays]
                up[n][at] += step
                down[n][at] -= step
                numeric[at] = (loss(*up) - loss(*down)) / (2 * step)
            np.testing.assert_allclose(t, numeric, rtol=1e-6, atol=1e-6)


def test_start_position_is_seen_beyond_the_window():
    # A huge logit on position 0 dominates every later row, however far.
    q, k, v = (numpy(x) for x in _inputs(50, batch=1, heads=1, seed=4))
    k = np.concatenate([q[:, :, 1:2] * 0 + 30.0, k[:, :, 1:]], axis=2)
    q = np.abs(q) + 1.0
    out, _ = banded_attention(tensor(q), tensor(k), tensor(v), window=4, chunk_size=CHUNK)
    np.testing.assert_allclose(numpy(out)[0, 0, 10:], np.broadcast_to(v[0, 0, 0], (40, 3)), rtol=1e-6, atol=1e-6)


def test_distance_bias_in_nats():
    # One earlier key, zero logits: weight e^{b} / (1 + e^{b}) on its value.
    q = tensor(np.zeros([1, 1, 3, 2]))
    v = tensor(np.array([[[[1.0], [7.0], [0.0]]]]))
    out, _ = banded_attention(q, q, v, window=2, slope=0.5, hyper=3.0)
    out = numpy(out)
    bias = -0.5 + 3.0  # Δ = 1 for the window key 1 of row 2; the start key 0 is at Δ = 2.
    start_bias = -0.5 * 2 + 3.0 / 2
    want = (np.exp(bias) * 7.0 + np.exp(start_bias) * 1.0) / (1 + np.exp(bias) + np.exp(start_bias))
    np.testing.assert_allclose(out[0, 0, 2, 0], want, rtol=1e-12)
    np.testing.assert_allclose(out[0, 0, 1, 0], np.exp(bias) / (1 + np.exp(bias)), rtol=1e-12)


@pytest.mark.parametrize("window", [None, 7, 64])
def test_float32_large_logits_exact_and_finite(window):
    # Logits reach +-300: exp() of them overflows float32 (and float64 sums would lose rows).
    q, k, v = _inputs(257, scale=80.0, seed=5)
    q32, k32, v32 = (ops.cast(x, "float32") for x in (q, k, v))
    # The gradient of sum(out ** 2): cotangent 2 * out.
    out = numpy(banded_attention(q32, k32, v32, window=window, chunk_size=CHUNK, slope=0.1, hyper=5.0)[0])
    (out,), grads = outputs_and_gradients(
        lambda q, k, v: banded_attention(q, k, v, window=window, chunk_size=CHUNK, slope=0.1, hyper=5.0)[0],
        [q32, k32, v32],
        2.0 * out,
    )
    _assert_finite(out, *grads)
    assert np.abs(np.einsum("bhiq,bhjq->bhij", numpy(q), numpy(k)) / 2.0).max() > 300
    ref = banded_attention_reference(q, k, v, window=window, slope=0.1, hyper=5.0)
    np.testing.assert_allclose(out, numpy(ref), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", [None, 5, 40])
def test_causality(window):
    q, k, v = _inputs(100, seed=6, dtype="float32")
    out, _ = banded_attention(q, k, v, window=window, chunk_size=CHUNK, **BIAS)
    t = 37
    changed = [ops.concatenate([x[:, :, : t + 1], x[:, :, t + 1 :] * -3.0 + 1.0], axis=2) for x in (q, k, v)]
    out2, _ = banded_attention(*changed, window=window, chunk_size=CHUNK, **BIAS)
    np.testing.assert_array_equal(numpy(out)[:, :, : t + 1], numpy(out2)[:, :, : t + 1])


@pytest.mark.parametrize("window", [None, 2, 5, 40])
def test_prefill_then_chunk_then_steps_equal_parallel(window):
    q, k, v = _inputs(90, seed=7)
    mask = np.ones((2, 90), bool)
    mask[0, 30:35] = False
    mask[1, 60] = False
    full, _ = banded_attention(q, k, v, window=window, mask=tensor(mask), chunk_size=CHUNK, **BIAS)
    state = empty_banded_state(2, 2, 4, 3, window=window, max_sequence_length=128, dtype="float64")
    outs = []
    for lo, hi in [(0, 50), (50, 70)]:
        out, state = banded_attention(
            q[:, :, lo:hi],
            k[:, :, lo:hi],
            v[:, :, lo:hi],
            window=window,
            mask=tensor(mask[:, lo:hi]),
            initial_state=state,
            chunk_size=CHUNK,
            **BIAS,
        )
        outs.append(out)
    for t in range(70, 90):
        out, state = banded_attention_step(
            state, q[:, :, t], k[:, :, t], v[:, :, t], window=window, mask=tensor(mask[:, t]), **BIAS
        )
        outs.append(out[:, :, None])
    np.testing.assert_allclose(numpy(ops.concatenate(outs, 2)), numpy(full), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(numpy(state[3]), [90, 90])
    slots = 128 if window is None else window
    assert [tuple(s.shape) for s in state[:3]] == [(2, 2, slots, 4), (2, 2, slots, 3), (2, slots)]


@pytest.mark.parametrize("window", [None, 3])
def test_steps_from_empty_state(window):
    q, k, v = _inputs(12, seed=8)
    full, _ = banded_attention(q, k, v, window=window, **BIAS)
    state = empty_banded_state(2, 2, 4, 3, window=window, max_sequence_length=12, dtype="float64")
    for t in range(12):
        out, state = banded_attention_step(state, q[:, :, t], k[:, :, t], v[:, :, t], window=window, **BIAS)
        np.testing.assert_allclose(numpy(out), numpy(full)[:, :, t], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("window", [None, 3, 40])
def test_masked_positions_contribute_nothing(window):
    q, k, v = _inputs(70, seed=9)
    mask = np.ones((2, 70), bool)
    mask[0, 10:20] = False
    mask[1, :3] = False  # the start position itself is padding
    mask_t = tensor(mask)
    out, _ = banded_attention(q, k, v, window=window, mask=mask_t, chunk_size=CHUNK, **BIAS)
    noisy_k = tensor(np.where(mask[:, None, :, None], numpy(k), 1e4))
    noisy_v = tensor(np.where(mask[:, None, :, None], numpy(v), 1e4))
    out2, _ = banded_attention(q, noisy_k, noisy_v, window=window, mask=mask_t, chunk_size=CHUNK, **BIAS)
    ref = banded_attention_reference(q, k, v, window=window, mask=mask_t, **BIAS)
    _assert_finite(out, out2)
    np.testing.assert_allclose(numpy(out), numpy(ref), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(numpy(out), numpy(out2))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_inputs_accumulate_in_float32(dtype):
    q, k, v = _inputs(4096, batch=1, heads=1, key_dim=8, scale=10.0, seed=10, dtype=dtype)
    out, state = banded_attention(q, k, v, window=64, slope=0.2, hyper=4.0)
    assert dtype_of(out) == "float32" and dtype_of(state[0]) == "float32"
    _assert_finite(out, state[0], state[1])


@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_outputs_and_gradients_follow_float32(dtype, window):
    inputs = _inputs(100, scale=2.0)
    assert_low_precision_follows_float32(
        lambda q, k, v: banded_attention(q, k, v, window=window, chunk_size=CHUNK, **BIAS), inputs, dtype
    )


@pytest.mark.parametrize("window", [None, 5])
def test_empty_sequence(window):
    q, k, v = _inputs(0)
    out, state = banded_attention(q, k, v, window=window)
    assert tuple(out.shape) == (2, 2, 0, 3)
    np.testing.assert_array_equal(numpy(state[3]), [0, 0])
    if window is not None:
        for s, e in zip(state, empty_banded_state(2, 2, 4, 3, window=window, dtype="float64")):
            np.testing.assert_array_equal(numpy(s), numpy(e))


@pytest.mark.parametrize(
    "form", ["dense", "windowed", "packed dense", "packed windowed", "continued dense", "continued windowed"]
)
def test_compiled_equals_eager(form):
    """Each parallel form, and the decoding step, give the same numbers compiled (XLA, `jax.jit`) as eagerly."""
    window = None if "dense" in form else 5
    q, k, v = _inputs(70, seed=12, dtype="float32")
    mask = np.ones((2, 70), bool)
    mask[1, [3, 40]] = False
    starts = np.zeros((2, 70), bool)
    starts[0, [0, 20]] = True
    starts[1, 33] = True
    mask, starts = tensor(mask), tensor(starts) if "packed" in form else None
    initial = None
    if "continued" in form:
        empty = empty_banded_state(2, 2, 4, 3, window=window, max_sequence_length=80)
        _, initial = banded_attention(q[:, :, :9], k[:, :, :9], v[:, :, :9], window=window, initial_state=empty)

    def forward(q, k, v):
        out, state = banded_attention(
            q, k, v, window=window, mask=mask, initial_state=initial, document_starts=starts, chunk_size=CHUNK, **BIAS
        )
        if state is None or form == "dense":  # packed documents keep no state; a dense one is full
            return (out,)
        step, state = banded_attention_step(state, q[:, :, -1], k[:, :, -1], v[:, :, -1], window=window, **BIAS)
        return (out, step, *state)

    for eager, fast in zip(forward(q, k, v), compiled(forward)(q, k, v)):
        np.testing.assert_allclose(numpy(fast), numpy(eager), rtol=1e-5, atol=1e-6)


@pytest.mark.tf_only
def test_compiles_with_dynamic_length_and_xla():
    import tensorflow as tf

    fn = tf.function(
        lambda q, k, v: banded_attention(q, k, v, window=20, chunk_size=CHUNK, **BIAS)[0],
        input_signature=[tf.TensorSpec([None, None, None, 4], tf.float32)] * 2
        + [tf.TensorSpec([None, None, None, 3], tf.float32)],
        jit_compile=True,
    )
    for length in [5, 130]:
        q, k, v = _inputs(length, seed=11)
        ref = banded_attention_reference(q, k, v, window=20, **BIAS)
        np.testing.assert_allclose(fn(*(tf.cast(x, tf.float32) for x in (q, k, v))), numpy(ref), rtol=1e-5, atol=1e-5)


def test_bad_arguments():
    q, k, v = _inputs(4)
    for window in [0, 1, 2.5, True]:
        with pytest.raises(ValueError, match="window"):
            banded_attention(q, k, v, window=window)
    with pytest.raises(ValueError, match="max_sequence_length=None"):
        empty_banded_state(1, 1, 4, 3)
    state = empty_banded_state(2, 2, 4, 3, max_sequence_length=3, dtype="float64")
    with pytest.raises(_CHECK_ERROR, match="fewer positions"):
        banded_attention(q, k, v, initial_state=state)
    full = empty_banded_state(2, 2, 4, 3, max_sequence_length=4, dtype="float64")
    _, full = banded_attention(q, k, v, initial_state=full)
    with pytest.raises(_CHECK_ERROR, match="fewer positions"):
        banded_attention_step(full, q[:, :, 0], k[:, :, 0], v[:, :, 0])
