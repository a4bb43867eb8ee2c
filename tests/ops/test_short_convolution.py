import numpy as np
import pytest

from elita_tf.ops.reference import short_convolution_reference
from elita_tf.ops.short_convolution import (
    empty_short_convolution_state,
    short_convolution,
    short_convolution_step,
)
from tests.backend_utils import compiled, numpy, outputs_and_gradients, tensor
from tests.ops.documents import random_document_starts

WIDTH = 5


def _inputs(length, size=4, batch=2, seed=0, dtype="float64"):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: tensor(rng.normal(size=shape), dtype)  # noqa: E731
    return normal(batch, length, WIDTH), normal(size, WIDTH), normal(WIDTH)


def _mask(length, seed=3):
    mask = np.random.default_rng(seed).random((2, length)) > 0.2
    mask[0, -3:] = False  # right padding in one row
    return mask


@pytest.mark.parametrize("size", [1, 4])
@pytest.mark.parametrize("length", [1, 63, 100, 257])
def test_outputs_and_gradients_match_reference(length, size):
    x, kernel, bias = _inputs(length, size)
    mask = tensor(_mask(length))
    starts = tensor(random_document_starts(2, length))
    cotangent = np.random.default_rng(1).normal(size=x.shape)

    def run(fn):
        (y,), grads = outputs_and_gradients(fn, [x, kernel, bias], cotangent)
        return [y, *grads]

    for kwargs in [{}, {"mask": mask}, {"document_starts": starts}, {"mask": mask, "document_starts": starts}]:
        got = run(lambda x, w, b: short_convolution(x, w, b, **kwargs)[0])
        want = run(lambda x, w, b: short_convolution_reference(x, w, b, **kwargs))
        for g, w in zip(got, want):
            assert np.all(np.isfinite(g))
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_causal_exactly():
    x, kernel, bias = _inputs(40)
    changed = numpy(x).copy()
    changed[:, 21:] += 100.0
    before, after = (numpy(short_convolution(t, kernel, bias)[0]) for t in (x, tensor(changed)))
    np.testing.assert_array_equal(after[:, :21], before[:, :21])
    assert not np.allclose(after[:, 21], before[:, 21])


def test_prefill_chunks_and_steps_continue_the_state():
    x, kernel, bias = _inputs(30)
    mask = _mask(30)
    # Padding ending a call ends the row's state there (right padding): here each call ends on a real position.
    mask[:, [1, 10, 11, 29]] = True
    want, want_state = short_convolution(x, kernel, bias, mask=tensor(mask))
    state, pieces = empty_short_convolution_state(2, 4, WIDTH, "float64"), []
    for start, stop in [(0, 2), (2, 11), (11, 12)]:
        y, state = short_convolution(x[:, start:stop], kernel, bias, mask=tensor(mask[:, start:stop]), initial_state=state)
        pieces.append(numpy(y))
    for t in range(12, 30):
        y, state = short_convolution_step(state, x[:, t], kernel, bias, mask=tensor(mask[:, t]))
        pieces.append(numpy(y)[:, None])
    np.testing.assert_allclose(np.concatenate(pieces, 1), numpy(want), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(numpy(state), numpy(want_state), rtol=1e-12, atol=1e-12)


def test_right_padding_is_not_part_of_the_state():
    x, kernel, bias = _inputs(12)
    mask = np.ones((2, 12), bool)
    mask[0, 7:] = False
    _, state = short_convolution(x, kernel, bias, mask=tensor(mask))
    _, alone = short_convolution(x[:1, :7], kernel, bias)
    np.testing.assert_array_equal(numpy(state)[0], numpy(alone)[0])
    np.testing.assert_array_equal(numpy(state)[0], numpy(x)[0, 4:7])  # the last K - 1 = 3 real inputs


def test_a_document_start_clears_the_state_it_continues_and_the_state_it_leaves():
    x, kernel, bias = _inputs(20)
    _, before = short_convolution(*_inputs(6, seed=4)[:1], kernel, bias)
    starts = np.zeros((2, 20), bool)
    starts[0, 0] = starts[1, 18] = True  # row 0 starts afresh; row 1's last document is 2 positions long
    y, state = short_convolution(x, kernel, bias, initial_state=before, document_starts=tensor(starts))
    np.testing.assert_allclose(numpy(y)[0], numpy(short_convolution(x[:1], kernel, bias)[0])[0], rtol=1e-12)
    np.testing.assert_allclose(numpy(y)[1, 18:], numpy(short_convolution(x[1:, 18:], kernel, bias)[0])[0], rtol=1e-12)
    np.testing.assert_array_equal(numpy(state)[1, 0], 0.0)  # position 17 belongs to the document before
    np.testing.assert_array_equal(numpy(state)[1, 1:], numpy(x)[1, 18:])


def test_float32_under_16_bit_inputs_and_compiled_equals_eager():
    x, kernel, bias = _inputs(100, dtype="float16")
    y, state = short_convolution(x, kernel, bias)
    assert str(numpy(y).dtype) == "float32" and str(numpy(state).dtype) == "float32"
    x, kernel, bias = _inputs(100, dtype="float32")
    starts = tensor(random_document_starts(2, 100))
    fn = lambda x, w, b: short_convolution(x, w, b, mask=tensor(_mask(100)), document_starts=starts)  # noqa: E731
    for eager, fast in zip(fn(x, kernel, bias), compiled(fn)(x, kernel, bias)):
        np.testing.assert_allclose(numpy(fast), numpy(eager), rtol=1e-6, atol=1e-6)
