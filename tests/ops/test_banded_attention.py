import numpy as np
import pytest
import tensorflow as tf

from elita_tf.ops.banded_attention import banded_attention, empty_banded_state
from elita_tf.ops.banded_attention_step import banded_attention_step
from elita_tf.ops.reference import banded_attention_reference
from tests.ops.low_precision import assert_low_precision_follows_float32

LENGTHS = [1, 63, 100, 257]
# Smaller and larger than the chunk (16 in these tests, 32 by default); None is "wide".
WINDOWS = [None, 2, 5, 16, 40, 300]
CHUNK = 16
BIAS = {"slope": 0.3, "hyper": 2.5}


def _inputs(length, batch=2, heads=2, key_dim=4, value_dim=3, scale=1.0, seed=0, dtype=tf.float64):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, heads, length, key_dim)) * scale
    k = rng.normal(size=(batch, heads, length, key_dim))
    v = rng.normal(size=(batch, heads, length, value_dim))
    return tuple(tf.constant(x, dtype) for x in (q, k, v))


def _assert_finite(*tensors):
    for t in tensors:
        assert np.all(np.isfinite(t.numpy())), "non-finite values"


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("window", WINDOWS)
def test_forward_matches_reference_float64(length, window):
    q, k, v = _inputs(length)
    out, _ = banded_attention(q, k, v, window=window, chunk_size=CHUNK, **BIAS)
    ref = banded_attention_reference(q, k, v, window=window, **BIAS)
    assert out.dtype == tf.float64
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)
    # Row 0 sees only the null slot.
    np.testing.assert_array_equal(out[:, :, 0], 0.0)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("window", [None, 5, 40])
def test_gradients_match_reference(length, window):
    q, k, v = _inputs(length, seed=1)
    cotangent = tf.constant(np.random.default_rng(2).normal(size=v.shape))

    def grads(fn):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = tf.reduce_sum(fn(q, k, v) * cotangent)
        return tape.gradient(loss, [q, k, v])

    got = grads(lambda q, k, v: banded_attention(q, k, v, window=window, chunk_size=CHUNK, **BIAS)[0])
    want = grads(lambda q, k, v: banded_attention_reference(q, k, v, window=window, **BIAS))
    for g, w in zip(got, want):
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
    cotangent = tf.constant(np.random.default_rng(2).normal(size=v.shape))

    def grads(fn):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = fn(q, k, v)
            loss = tf.reduce_sum(out * cotangent)
        return [out] + tape.gradient(loss, [q, k, v])

    packed = grads(
        lambda q, k, v: banded_attention(
            q, k, v, window=window, mask=mask, document_starts=document_starts, chunk_size=CHUNK, **BIAS
        )[0]
    )
    want = grads(
        lambda q, k, v: banded_attention_reference(
            q, k, v, window=window, mask=mask, document_starts=document_starts, **BIAS
        )
    )
    for got, expected in zip(packed, want):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-10)
    for row in range(2):
        bounds = sorted({0, *np.flatnonzero(document_starts[row])}) + [75]
        for a, b in zip(bounds[:-1], bounds[1:]):
            alone, _ = banded_attention(
                *(x[row : row + 1, :, a:b] for x in (q, k, v)),
                window=window,
                mask=mask[row : row + 1, a:b],
                chunk_size=CHUNK,
                **BIAS,
            )
            np.testing.assert_allclose(packed[0][row : row + 1, :, a:b], alone, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="do not continue an `initial_state`"):
        banded_attention(
            q, k, v, window=window, document_starts=document_starts, initial_state=empty_banded_state(2, 2, 4, 3, 8, 80)
        )


def test_numeric_gradient_check():
    q, k, v = _inputs(13, batch=1, heads=1, key_dim=2, value_dim=2, seed=3)
    for window in [None, 3, 8]:
        theory, numeric = tf.test.compute_gradient(
            lambda q, k, v: banded_attention(q, k, v, window=window, chunk_size=4, **BIAS)[0], [q, k, v]
        )
        for t, n in zip(theory, numeric):
            np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


def test_start_position_is_seen_beyond_the_window():
    # A huge logit on position 0 dominates every later row, however far.
    q, k, v = _inputs(50, batch=1, heads=1, seed=4)
    k = tf.concat([q[:, :, 1:2] * 0 + 30.0, k[:, :, 1:]], axis=2)
    q = tf.abs(q) + 1.0
    out, _ = banded_attention(q, k, v, window=4, chunk_size=CHUNK)
    np.testing.assert_allclose(out[0, 0, 10:], np.broadcast_to(v[0, 0, 0], (40, 3)), rtol=1e-6, atol=1e-6)


def test_distance_bias_in_nats():
    # One earlier key, zero logits: weight e^{b} / (1 + e^{b}) on its value.
    q = tf.zeros([1, 1, 3, 2], tf.float64)
    v = tf.constant([[[[1.0], [7.0], [0.0]]]], tf.float64)
    out, _ = banded_attention(q, q, v, window=2, slope=0.5, hyper=3.0)
    bias = -0.5 + 3.0  # Δ = 1 for the window key 1 of row 2; the start key 0 is at Δ = 2.
    start_bias = -0.5 * 2 + 3.0 / 2
    want = (np.exp(bias) * 7.0 + np.exp(start_bias) * 1.0) / (1 + np.exp(bias) + np.exp(start_bias))
    np.testing.assert_allclose(out[0, 0, 2, 0], want, rtol=1e-12)
    np.testing.assert_allclose(out[0, 0, 1, 0], np.exp(bias) / (1 + np.exp(bias)), rtol=1e-12)


@pytest.mark.parametrize("window", [None, 7, 64])
def test_float32_large_logits_exact_and_finite(window):
    # Logits reach +-300: exp() of them overflows float32 (and float64 sums would lose rows).
    q, k, v = _inputs(257, scale=80.0, seed=5)
    with tf.GradientTape() as tape:
        q32, k32, v32 = (tf.cast(x, tf.float32) for x in (q, k, v))
        tape.watch([q32, k32, v32])
        out, _ = banded_attention(q32, k32, v32, window=window, chunk_size=CHUNK, slope=0.1, hyper=5.0)
        loss = tf.reduce_sum(out**2)
    _assert_finite(out, *tape.gradient(loss, [q32, k32, v32]))
    assert np.abs(tf.einsum("bhiq,bhjq->bhij", q, k) / 2.0).max() > 300
    ref = banded_attention_reference(q, k, v, window=window, slope=0.1, hyper=5.0)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", [None, 5, 40])
def test_causality(window):
    q, k, v = _inputs(100, seed=6, dtype=tf.float32)
    out, _ = banded_attention(q, k, v, window=window, chunk_size=CHUNK, **BIAS)
    t = 37
    changed = [tf.concat([x[:, :, : t + 1], x[:, :, t + 1 :] * -3.0 + 1.0], axis=2) for x in (q, k, v)]
    out2, _ = banded_attention(*changed, window=window, chunk_size=CHUNK, **BIAS)
    np.testing.assert_array_equal(out[:, :, : t + 1], out2[:, :, : t + 1])


@pytest.mark.parametrize("window", [None, 2, 5, 40])
def test_prefill_then_chunk_then_steps_equal_parallel(window):
    q, k, v = _inputs(90, seed=7)
    mask = np.ones((2, 90), bool)
    mask[0, 30:35] = False
    mask[1, 60] = False
    full, _ = banded_attention(q, k, v, window=window, mask=mask, chunk_size=CHUNK, **BIAS)
    state = empty_banded_state(2, 2, 4, 3, window=window, max_sequence_length=128, dtype=tf.float64)
    outs = []
    for lo, hi in [(0, 50), (50, 70)]:
        out, state = banded_attention(
            q[:, :, lo:hi],
            k[:, :, lo:hi],
            v[:, :, lo:hi],
            window=window,
            mask=mask[:, lo:hi],
            initial_state=state,
            chunk_size=CHUNK,
            **BIAS,
        )
        outs.append(out)
    for t in range(70, 90):
        out, state = banded_attention_step(
            state, q[:, :, t], k[:, :, t], v[:, :, t], window=window, mask=mask[:, t], **BIAS
        )
        outs.append(out[:, :, None])
    np.testing.assert_allclose(tf.concat(outs, 2), full, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(state[3], [90, 90])
    slots = 128 if window is None else window
    assert [tuple(s.shape) for s in state[:3]] == [(2, 2, slots, 4), (2, 2, slots, 3), (2, slots)]


@pytest.mark.parametrize("window", [None, 3])
def test_steps_from_empty_state(window):
    q, k, v = _inputs(12, seed=8)
    full, _ = banded_attention(q, k, v, window=window, **BIAS)
    state = empty_banded_state(2, 2, 4, 3, window=window, max_sequence_length=12, dtype=tf.float64)
    for t in range(12):
        out, state = banded_attention_step(state, q[:, :, t], k[:, :, t], v[:, :, t], window=window, **BIAS)
        np.testing.assert_allclose(out, full[:, :, t], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("window", [None, 3, 40])
def test_masked_positions_contribute_nothing(window):
    q, k, v = _inputs(70, seed=9)
    mask = np.ones((2, 70), bool)
    mask[0, 10:20] = False
    mask[1, :3] = False  # the start position itself is padding
    out, _ = banded_attention(q, k, v, window=window, mask=mask, chunk_size=CHUNK, **BIAS)
    noisy_k = tf.where(mask[:, None, :, None], k, 1e4)
    noisy_v = tf.where(mask[:, None, :, None], v, 1e4)
    out2, _ = banded_attention(q, noisy_k, noisy_v, window=window, mask=mask, chunk_size=CHUNK, **BIAS)
    ref = banded_attention_reference(q, k, v, window=window, mask=mask, **BIAS)
    _assert_finite(out, out2)
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(out, out2)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_low_precision_inputs_accumulate_in_float32(dtype):
    q, k, v = _inputs(4096, batch=1, heads=1, key_dim=8, scale=10.0, seed=10, dtype=dtype)
    out, state = banded_attention(q, k, v, window=64, slope=0.2, hyper=4.0)
    assert out.dtype == tf.float32 and state[0].dtype == tf.float32
    _assert_finite(out, state[0], state[1])


@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_low_precision_outputs_and_gradients_follow_float32(dtype, window):
    inputs = _inputs(100, scale=2.0)
    assert_low_precision_follows_float32(
        lambda q, k, v: banded_attention(q, k, v, window=window, chunk_size=CHUNK, **BIAS), inputs, dtype
    )


@pytest.mark.parametrize("window", [None, 5])
def test_empty_sequence(window):
    q, k, v = _inputs(0)
    out, state = banded_attention(q, k, v, window=window)
    assert out.shape == (2, 2, 0, 3)
    np.testing.assert_array_equal(state[3], [0, 0])
    if window is not None:
        for s, e in zip(state, empty_banded_state(2, 2, 4, 3, window=window, dtype=tf.float64)):
            np.testing.assert_array_equal(s, e)


def test_compiles_with_dynamic_length_and_xla():
    fn = tf.function(
        lambda q, k, v: banded_attention(q, k, v, window=20, chunk_size=CHUNK, **BIAS)[0],
        input_signature=[tf.TensorSpec([None, None, None, 4], tf.float32)] * 2
        + [tf.TensorSpec([None, None, None, 3], tf.float32)],
        jit_compile=True,
    )
    for length in [5, 130]:
        q, k, v = _inputs(length, seed=11)
        ref = banded_attention_reference(q, k, v, window=20, **BIAS)
        np.testing.assert_allclose(fn(*(tf.cast(x, tf.float32) for x in (q, k, v))), ref, rtol=1e-5, atol=1e-5)


def test_bad_arguments():
    q, k, v = _inputs(4)
    for window in [0, 1, 2.5, True]:
        with pytest.raises(ValueError, match="window"):
            banded_attention(q, k, v, window=window)
    with pytest.raises(ValueError, match="max_sequence_length=None"):
        empty_banded_state(1, 1, 4, 3)
    state = empty_banded_state(2, 2, 4, 3, max_sequence_length=3, dtype=tf.float64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="fewer positions"):
        banded_attention(q, k, v, initial_state=state)
