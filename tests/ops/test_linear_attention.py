import numpy as np
import pytest
from keras import ops

from elita_tf.ops.linear_attention import (
    causal_linear_attention,
    causal_linear_attention_step,
    empty_linear_state,
)
from elita_tf.ops.reference import causal_linear_attention_reference
from tests.backend_utils import compiled, numpy, outputs_and_gradients, tensor
from tests.ops.documents import by_document, random_document_starts

CHUNK = 16


def _inputs(length, batch=2, heads=2, dk=3, dv=4, seed=0, dtype="float64"):
    rng = np.random.default_rng(seed)
    features = lambda: tensor(np.exp(rng.normal(size=(batch, heads, length, dk))), dtype)  # noqa: E731
    q, k = features(), features()
    return q, k, tensor(rng.normal(size=(batch, heads, length, dv)), dtype)


@pytest.mark.parametrize("length", [1, 63, 100, 257])
def test_outputs_and_gradients_match_reference(length):
    q, k, v = _inputs(length)
    cotangent = np.random.default_rng(1).normal(size=v.shape)

    def run(fn):
        (y,), grads = outputs_and_gradients(fn, [q, k, v], cotangent)
        return [y] + grads

    got = run(lambda q, k, v: causal_linear_attention(q, k, v, chunk_size=CHUNK)[0])
    want = run(causal_linear_attention_reference)
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("document_starts", [False, True])
def test_compiled_equals_eager(document_starts):
    q, k, v = _inputs(100, dtype="float32", seed=5)
    _, initial = causal_linear_attention(*_inputs(9, seed=1, dtype="float32"), chunk_size=CHUNK)
    starts = tensor(random_document_starts(2, 100)) if document_starts else None
    mask = np.ones((2, 100), bool)
    mask[1, 40:45] = False
    mask = tensor(mask)

    def fn(q, k, v, s, z):
        return causal_linear_attention(
            q, k, v, mask=mask, initial_state=(s, z), document_starts=starts, chunk_size=CHUNK
        )

    eager, fast = fn(q, k, v, *initial), compiled(fn)(q, k, v, *initial)
    for e, f in zip([eager[0], *eager[1]], [fast[0], *fast[1]]):
        np.testing.assert_allclose(numpy(f), numpy(e), rtol=1e-5, atol=1e-5)


def test_float32_long_sequence_finite_and_accurate():
    q, k, v = _inputs(4097, dtype="float32", seed=2)
    y, state = causal_linear_attention(q, k, v)
    want = causal_linear_attention_reference(*(ops.cast(t, "float64") for t in (q, k, v)))
    np.testing.assert_allclose(numpy(y), numpy(want), rtol=1e-4, atol=1e-4)
    assert all(np.all(np.isfinite(numpy(s))) for s in state)


def test_causality_and_masking():
    q, k, v = _inputs(50, seed=3)
    y, _ = causal_linear_attention(q, k, v, chunk_size=CHUNK)
    t = 20
    changed = ops.concatenate([k[:, :, : t + 1], k[:, :, t + 1 :] * 7], 2)
    y2, _ = causal_linear_attention(q, changed, v, chunk_size=CHUNK)
    np.testing.assert_array_equal(numpy(y)[:, :, : t + 1], numpy(y2)[:, :, : t + 1])
    mask = np.ones((2, 50), bool)
    mask[0, 5:9] = False
    ym, _ = causal_linear_attention(q, k, v, mask=tensor(mask), chunk_size=CHUNK)
    want = causal_linear_attention_reference(q, k, v, mask=tensor(mask))
    np.testing.assert_allclose(numpy(ym), numpy(want), rtol=1e-9, atol=1e-9)


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
    np.testing.assert_allclose(numpy(ops.concatenate(outs, 2)), numpy(full), rtol=1e-10, atol=1e-10)
    assert [tuple(s.shape) for s in state] == [(2, 2, 3, 4), (2, 2, 3)]


def test_empty_sequence():
    q, k, v = _inputs(0)
    y, state = causal_linear_attention(q, k, v)
    assert tuple(y.shape) == (2, 2, 0, 4)
    for s, e in zip(state, empty_linear_state(2, 2, 3, 4, "float64")):
        np.testing.assert_array_equal(numpy(s), numpy(e))


@pytest.mark.parametrize("length", [1, 37, 100])
def test_document_starts_equal_each_document_run_apart(length):
    q, k, v = _inputs(length)
    _, initial = causal_linear_attention(*_inputs(9, seed=1), chunk_size=CHUNK)
    document_starts = random_document_starts(2, length)
    cotangent = np.random.default_rng(2).normal(size=v.shape)

    def run(fn):
        outputs, grads = outputs_and_gradients(
            lambda q, k, v, s, z: (lambda o: (o[0][0], *o[1]))(fn(q, k, v, (s, z))),
            [q, k, v, *initial],
            [cotangent, None, None],
        )
        return outputs + grads

    def apart(inputs, state):
        outputs, state = causal_linear_attention(*inputs, initial_state=state, chunk_size=CHUNK)
        return (outputs,), state

    def together(q, k, v, initial):
        outputs, state = causal_linear_attention(
            q, k, v, initial_state=initial, document_starts=tensor(document_starts), chunk_size=CHUNK
        )
        return (outputs,), state

    got = run(together)
    want = run(lambda q, k, v, initial: by_document(apart, (q, k, v), document_starts, initial))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-10)
