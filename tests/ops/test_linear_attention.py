import numpy as np
import pytest
import tensorflow as tf

from elita_tf.ops.linear_attention import (
    causal_linear_attention,
    causal_linear_attention_step,
    empty_linear_state,
)
from elita_tf.ops.reference import causal_linear_attention_reference
from tests.ops.documents import by_document, random_document_starts

CHUNK = 16


def _inputs(length, batch=2, heads=2, dk=3, dv=4, seed=0, dtype=tf.float64):
    rng = np.random.default_rng(seed)
    features = lambda: tf.constant(np.exp(rng.normal(size=(batch, heads, length, dk))), dtype)  # noqa: E731
    q, k = features(), features()
    return q, k, tf.constant(rng.normal(size=(batch, heads, length, dv)), dtype)


@pytest.mark.parametrize("length", [1, 63, 100, 257])
def test_outputs_and_gradients_match_reference(length):
    q, k, v = _inputs(length)
    cotangent = tf.constant(np.random.default_rng(1).normal(size=v.shape))

    def run(fn):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            y = fn(q, k, v)
            loss = tf.reduce_sum(y * cotangent)
        return [y] + tape.gradient(loss, [q, k, v])

    got = run(lambda q, k, v: causal_linear_attention(q, k, v, chunk_size=CHUNK)[0])
    want = run(causal_linear_attention_reference)
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9)


def test_float32_long_sequence_finite_and_accurate():
    q, k, v = _inputs(4097, dtype=tf.float32, seed=2)
    y, state = causal_linear_attention(q, k, v)
    want = causal_linear_attention_reference(*(tf.cast(t, tf.float64) for t in (q, k, v)))
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    assert all(np.all(np.isfinite(s)) for s in state)


def test_causality_and_masking():
    q, k, v = _inputs(50, seed=3)
    y, _ = causal_linear_attention(q, k, v, chunk_size=CHUNK)
    t = 20
    y2, _ = causal_linear_attention(q, tf.concat([k[:, :, : t + 1], k[:, :, t + 1 :] * 7], 2), v, chunk_size=CHUNK)
    np.testing.assert_array_equal(y[:, :, : t + 1], y2[:, :, : t + 1])
    mask = np.ones((2, 50), bool)
    mask[0, 5:9] = False
    ym, _ = causal_linear_attention(q, k, v, mask=mask, chunk_size=CHUNK)
    np.testing.assert_allclose(ym, causal_linear_attention_reference(q, k, v, mask=mask), rtol=1e-9, atol=1e-9)


def test_prefill_then_steps_equal_parallel():
    q, k, v = _inputs(70, seed=4)
    full, _ = causal_linear_attention(q, k, v, chunk_size=CHUNK)
    y1, state = causal_linear_attention(q[:, :, :40], k[:, :, :40], v[:, :, :40], chunk_size=CHUNK)
    y2, state = causal_linear_attention(
        q[:, :, 40:50], k[:, :, 40:50], v[:, :, 40:50], initial_state=state, chunk_size=CHUNK
    )
    outs = [y1, y2]
    for t in range(50, 70):
        y, state = causal_linear_attention_step(state, q[:, :, t], k[:, :, t], v[:, :, t])
        outs.append(y[:, :, None])
    np.testing.assert_allclose(tf.concat(outs, 2), full, rtol=1e-10, atol=1e-10)
    assert [tuple(s.shape) for s in state] == [(2, 2, 3, 4), (2, 2, 3)]


def test_empty_sequence():
    q, k, v = _inputs(0)
    y, state = causal_linear_attention(q, k, v)
    assert y.shape == (2, 2, 0, 4)
    for s, e in zip(state, empty_linear_state(2, 2, 3, 4, tf.float64)):
        np.testing.assert_array_equal(s, e)


@pytest.mark.parametrize("length", [1, 37, 100])
def test_document_starts_equal_each_document_run_apart(length):
    q, k, v = _inputs(length)
    _, initial = causal_linear_attention(*_inputs(9, seed=1), chunk_size=CHUNK)
    document_starts = random_document_starts(2, length)
    cotangent = tf.constant(np.random.default_rng(2).normal(size=v.shape))

    def run(fn):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v, *initial])
            (outputs,), state = fn()
            loss = tf.reduce_sum(outputs * cotangent)
        return [outputs, *state, *tape.gradient(loss, [q, k, v, *initial])]

    def apart(inputs, state):
        outputs, state = causal_linear_attention(*inputs, initial_state=state, chunk_size=CHUNK)
        return (outputs,), state

    def together():
        outputs, state = causal_linear_attention(
            q, k, v, initial_state=initial, document_starts=document_starts, chunk_size=CHUNK
        )
        return (outputs,), state

    got, want = run(together), run(lambda: by_document(apart, (q, k, v), document_starts, initial))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), 0.0 if w is None else w.numpy(), atol=1e-10)
