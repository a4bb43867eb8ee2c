import numpy as np
import pytest
from keras import ops

from elita_tf.ops.causal_softmax_mean import causal_softmax_mean, causal_softmax_mean_step, empty_softmax_mean_state
from elita_tf.ops.reference import causal_softmax_mean_reference
from elita_tf.ops.utils.dtypes import dtype_of
from tests.backend_utils import compiled, numpy, outputs_and_gradients, random_normal, tensor
from tests.ops.documents import by_document, random_document_starts
from tests.ops.low_precision import assert_low_precision_follows_float32

LENGTHS = [1, 63, 100, 257]
# Smaller and larger than the chunk (16 in these tests, 32 by default): whole chunks (32), one
# chunk and a part (21), and more chunks than a chunk holds (300: whole chunks in windows again).
WINDOWS = [None, 1, 5, 16, 21, 32, 40, 300]
CHUNK = 16


def _arrays(length, scale=3.0, batch=2, heads=3, depth=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(batch, heads, length)) * scale, rng.normal(size=(batch, heads, length, depth))


def _inputs(length, scale=3.0, batch=2, heads=3, depth=4, seed=0, dtype="float32"):
    logits, values = _arrays(length, scale, batch, heads, depth, seed)
    return tensor(logits, dtype), tensor(values, dtype)


def _assert_finite(*tensors):
    for t in tensors:
        assert np.all(np.isfinite(numpy(t))), "non-finite values"


def _outputs_and_gradients(fn, logits, values, seed, real=None):
    """`fn`'s mean and log-normaliser and the gradients of a random projection of them; `real` (`[B, T]`
    0/1) keeps those positions only."""
    rng = np.random.default_rng(seed)
    cot_mean = rng.normal(size=values.shape)
    cot_lz = rng.normal(size=logits.shape)
    real = np.ones((logits.shape[0], logits.shape[2])) if real is None else np.asarray(real, np.float64)
    real = real[:, None, :]
    (mean, log_z), grads = outputs_and_gradients(
        lambda l, v: fn(l, v)[:2], [logits, values], [cot_mean * real[..., None], cot_lz * real]
    )
    return [mean * real[..., None], log_z * real, *grads]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("window", WINDOWS)
def test_forward_matches_reference_float64(length, window):
    logits, values = _inputs(length, dtype="float64")
    mean, log_z, _ = causal_softmax_mean(logits, values, window=window, chunk_size=CHUNK)
    ref_mean, ref_log_z = causal_softmax_mean_reference(logits, values, window=window)
    np.testing.assert_allclose(numpy(mean), numpy(ref_mean), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(numpy(log_z), numpy(ref_log_z), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("window", WINDOWS)
def test_gradients_match_reference(length, window):
    logits, values = _inputs(length, dtype="float64", seed=1)
    got = _outputs_and_gradients(
        lambda l, v: causal_softmax_mean(l, v, window=window, chunk_size=CHUNK), logits, values, seed=2
    )[2:]
    want = _outputs_and_gradients(
        lambda l, v: causal_softmax_mean_reference(l, v, window=window), logits, values, seed=2
    )[2:]
    for g, w in zip(got, want):
        _assert_finite(g)
        np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("window", [None, 7, 40])
def test_float32_large_logits_exact_and_finite(window, choice_form):
    # Logits up to +-80: exp() of them alone would overflow float32 sums.
    logits, values = _arrays(257, scale=40.0, seed=3)
    logits = np.clip(logits, -80.0, 80.0)
    (mean, log_z), (grad, _) = outputs_and_gradients(
        lambda l, v: causal_softmax_mean(l, v, window=window, chunk_size=CHUNK)[:2],
        [tensor(logits, "float32"), tensor(values, "float32")],
        [np.ones(values.shape), np.ones(logits.shape)],
    )
    _assert_finite(mean, log_z, grad)
    ref_mean, ref_log_z = causal_softmax_mean_reference(tensor(logits), tensor(values), window=window)
    np.testing.assert_allclose(mean, numpy(ref_mean), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(log_z, numpy(ref_log_z), rtol=1e-5, atol=1e-4)


def test_early_rows_survive_a_late_huge_logit(choice_form):
    # A single global max would underflow every earlier row to 0/0.
    logits = np.array([[[-80.0] * 70 + [80.0] + [-80.0] * 30]])
    values = numpy(random_normal([1, 1, 101, 2], seed=1))
    mean, _, _ = causal_softmax_mean(tensor(logits, "float32"), tensor(values, "float32"), chunk_size=CHUNK)
    ref, _ = causal_softmax_mean_reference(tensor(logits), tensor(values, "float64"))
    np.testing.assert_allclose(numpy(mean), numpy(ref), rtol=1e-5, atol=1e-5)


def _numeric_and_theoretical_jacobians(fn, inputs, delta=1.0 / 1024):
    """`fn`'s Jacobian, `[outputs, inputs]` flattened, by central differences and by the backend's gradients, as
    `tf.test.compute_gradient` takes them. Batch rows are independent, so every perturbation (and every output's
    one-hot cotangent) is a row of one batched call: `inputs` have batch size 1."""
    sizes = [x.size for x in inputs]
    flat = np.concatenate([x.ravel() for x in inputs])

    def split(rows):  # [R, total] -> each input with batch R
        parts = np.split(rows, np.cumsum(sizes)[:-1], axis=1)
        return [tensor(p.reshape((len(rows),) + x.shape[1:])) for p, x in zip(parts, inputs)]

    steps = delta * np.eye(flat.size)
    outputs = numpy(fn(*split(np.concatenate([flat + steps, flat - steps]))))
    outputs = outputs.reshape(2, flat.size, -1)
    numeric = ((outputs[0] - outputs[1]) / (2 * delta)).T  # [outputs, inputs]
    out_size = numeric.shape[0]
    cotangent = np.eye(out_size).reshape((out_size,) + outputs.shape[2:3]).reshape(
        (out_size,) + numpy(fn(*split(flat[None]))).shape[1:]
    )
    _, grads = outputs_and_gradients(fn, split(np.repeat(flat[None], out_size, axis=0)), [cotangent])
    theory = np.concatenate([g.reshape(out_size, -1) for g in grads], axis=1)
    return theory, numeric


def test_custom_grad_free_path_passes_numeric_gradient_check():
    logits, values = _arrays(21, batch=1, heads=1, depth=2, seed=4)
    for window in [None, 4, 19]:
        theory, numeric = _numeric_and_theoretical_jacobians(
            lambda l, v: causal_softmax_mean(l, v, window=window, chunk_size=8)[0], [logits, values]
        )
        np.testing.assert_allclose(theory, numeric, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("window", [None, 5, 40])
def test_causality(window):
    logits, values = _arrays(100, seed=5)
    mean, log_z, _ = causal_softmax_mean(tensor(logits, "float32"), tensor(values, "float32"), window=window, chunk_size=CHUNK)
    t = 37
    changed_l = np.concatenate([logits[..., : t + 1], logits[..., t + 1 :] + 50.0], axis=-1)
    changed_v = np.concatenate([values[:, :, : t + 1], -values[:, :, t + 1 :]], axis=2)
    mean2, log_z2, _ = causal_softmax_mean(
        tensor(changed_l, "float32"), tensor(changed_v, "float32"), window=window, chunk_size=CHUNK
    )
    np.testing.assert_array_equal(numpy(mean)[:, :, : t + 1], numpy(mean2)[:, :, : t + 1])
    np.testing.assert_array_equal(numpy(log_z)[:, :, : t + 1], numpy(log_z2)[:, :, : t + 1])


@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("with_resets", [False, True])
def test_rows_before_any_real_position_stay_causal(window, with_resets):
    # Their normaliser is NEG_INF, so `l_j - L_i` is about -NEG_INF for a later real key: the mask must still win.
    logits, values = _arrays(40, seed=10)
    mask = np.ones((2, 40), bool)
    mask[:, :5] = False
    document_starts = np.zeros((2, 40), bool) if with_resets else None
    if with_resets:
        document_starts[:, 20] = True
    kwargs = dict(window=window, mask=mask, chunk_size=CHUNK, document_starts=document_starts)
    mean, _, _ = causal_softmax_mean(tensor(logits, "float32"), tensor(values, "float32"), **kwargs)
    t = 3
    changed_v = np.concatenate([values[:, :, : t + 1], values[:, :, t + 1 :] + 100.0], axis=2)
    mean2, _, _ = causal_softmax_mean(tensor(logits, "float32"), tensor(changed_v, "float32"), **kwargs)
    _assert_finite(mean)
    np.testing.assert_array_equal(numpy(mean)[:, :, : t + 1], numpy(mean2)[:, :, : t + 1])


@pytest.mark.parametrize("dtype, rise", [("float32", 150.0), ("float64", 1000.0)])
def test_a_logit_past_the_span_switches_its_rows_exactly_and_causally(dtype, rise, choice_form):
    # Position 40 rises further above its chunk's reference than the factored weights allow (e^80
    # in float32, e^700 in float64): its rows take the exponential forms, the rows before stay
    # bit for bit what they were without it, and everything equals the reference.
    logits, values = _arrays(100, seed=13)
    logits, values = numpy(tensor(logits, dtype)).astype(np.float64), numpy(tensor(values, dtype)).astype(np.float64)
    t = 40
    high = np.concatenate([logits[..., :t], logits[..., t : t + 1] + rise, logits[..., t + 1 :]], axis=-1)
    cot_mean = numpy(tensor(np.random.default_rng(14).normal(size=values.shape), dtype)).astype(np.float64)

    def run(op, l, dtype):
        return outputs_and_gradients(
            lambda l, v: op(l, v)[:2], [tensor(l, dtype), tensor(values, dtype)], [cot_mean, np.ones(l.shape)]
        )

    (mean, log_z), _ = run(lambda l, v: causal_softmax_mean(l, v, chunk_size=CHUNK), logits, dtype)
    (high_mean, high_lz), grads = run(lambda l, v: causal_softmax_mean(l, v, chunk_size=CHUNK), high, dtype)
    _assert_finite(high_mean, high_lz, *grads)
    np.testing.assert_array_equal(high_mean[:, :, :t], mean[:, :, :t])
    np.testing.assert_array_equal(high_lz[:, :, :t], log_z[:, :, :t])

    (ref_mean, ref_lz), ref_grads = run(causal_softmax_mean_reference, high, "float64")
    tol = 1e-5 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(high_mean, ref_mean, rtol=tol, atol=tol)
    np.testing.assert_allclose(high_lz, ref_lz, rtol=tol, atol=tol)
    for g, w in zip(grads, ref_grads):
        np.testing.assert_allclose(g, w, rtol=10 * tol, atol=10 * tol)


@pytest.mark.parametrize("window", [None, 1, 5, 40])
def test_prefill_then_steps_equal_parallel(window):
    logits, values = _inputs(90, seed=6)
    full_mean, full_lz, _ = causal_softmax_mean(logits, values, window=window, chunk_size=CHUNK)

    # Prefill 50, continue with a 20-token chunk, then 20 single steps.
    mean_a, lz_a, state = causal_softmax_mean(logits[..., :50], values[:, :, :50], window=window, chunk_size=CHUNK)
    mean_b, lz_b, state = causal_softmax_mean(
        logits[..., 50:70], values[:, :, 50:70], window=window, initial_state=state, chunk_size=CHUNK
    )
    means, lzs = [mean_a, mean_b], [lz_a, lz_b]
    for t in range(70, 90):
        m, lz, state = causal_softmax_mean_step(state, logits[..., t], values[:, :, t], window=window)
        means.append(m[:, :, None])
        lzs.append(lz[..., None])
    np.testing.assert_allclose(numpy(ops.concatenate(means, 2)), numpy(full_mean), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(numpy(ops.concatenate(lzs, 2)), numpy(full_lz), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 6])
def test_steps_from_empty_state(window):
    logits, values = _inputs(12, seed=7)
    full_mean, _, _ = causal_softmax_mean(logits, values, window=window)
    state = empty_softmax_mean_state(2, 3, 4, window=window)
    for t in range(12):
        mean, _, state = causal_softmax_mean_step(state, logits[..., t], values[:, :, t], window=window)
        np.testing.assert_allclose(numpy(mean), numpy(full_mean)[:, :, t], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [None, 3, 40])
def test_masked_positions_contribute_nothing(window):
    logits, values = _arrays(70, seed=8)
    logits, values = logits.astype(np.float32), values.astype(np.float32)
    mask = np.ones((2, 70), bool)
    mask[0, 10:20] = False
    mask[1, :5] = False
    mean, log_z, _ = causal_softmax_mean(tensor(logits), tensor(values), window=window, mask=mask, chunk_size=CHUNK)
    # Garbage at masked positions must not leak.
    noisy_l = np.where(mask[:, None], logits, 1e4).astype(np.float32)
    noisy_v = np.where(mask[:, None, :, None], values, 1e4).astype(np.float32)
    mean2, _, _ = causal_softmax_mean(tensor(noisy_l), tensor(noisy_v), window=window, mask=mask, chunk_size=CHUNK)
    ref_mean, ref_lz = causal_softmax_mean_reference(
        tensor(logits, "float64"), tensor(values, "float64"), window=window, mask=tensor(mask)
    )
    _assert_finite(mean, mean2, log_z)
    # Rows that see at least one real position equal the reference.
    seen = causal_softmax_mean_reference(
        ops.zeros_like(ref_lz), ops.ones_like(ref_mean[..., :1]), window=window, mask=tensor(mask)
    )[1]
    rows = numpy(seen) > -1e30
    np.testing.assert_allclose(numpy(mean)[rows], numpy(ref_mean)[rows], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(numpy(mean2)[rows], numpy(ref_mean)[rows], rtol=1e-5, atol=1e-5)


def test_masked_step_leaves_global_state_unchanged():
    logits, values = _inputs(3, seed=9)
    state = empty_softmax_mean_state(2, 3, 4)
    _, _, state = causal_softmax_mean_step(state, logits[..., 0], values[:, :, 0])
    _, _, after = causal_softmax_mean_step(state, logits[..., 1], values[:, :, 1], mask=tensor([False, True]))
    np.testing.assert_array_equal(numpy(after[0])[0], numpy(state[0])[0])
    np.testing.assert_array_equal(numpy(after[1])[0], numpy(state[1])[0])
    assert not np.allclose(numpy(after[1])[1], numpy(state[1])[1])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_inputs_accumulate_in_float32(dtype):
    logits, values = _inputs(4096, scale=20.0, batch=1, heads=2, seed=10)
    mean, log_z, state = causal_softmax_mean(ops.cast(logits, dtype), ops.cast(values, dtype), window=None)
    assert dtype_of(mean) == "float32" and dtype_of(log_z) == "float32"
    _assert_finite(mean, log_z, *state)


@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_outputs_and_gradients_follow_float32(dtype, window):
    logits, values = _inputs(100, scale=3.0)
    assert_low_precision_follows_float32(
        lambda l, v: causal_softmax_mean(l, v, window=window, chunk_size=CHUNK), [logits, values], dtype
    )


@pytest.mark.parametrize("window", [None, 5, 300])
def test_empty_sequence(window):
    logits, values = _inputs(0)
    mean, log_z, state = causal_softmax_mean(logits, values, window=window)
    assert tuple(mean.shape) == (2, 3, 0, 4) and tuple(log_z.shape) == (2, 3, 0)
    empty = empty_softmax_mean_state(2, 3, 4, window=window)
    for s, e in zip(state, empty):
        np.testing.assert_array_equal(numpy(s), numpy(e))


@pytest.mark.tf_only
def test_compiles_with_dynamic_length_and_xla():
    import tensorflow as tf

    fn = tf.function(
        lambda l, v: causal_softmax_mean(l, v, window=None)[:2],
        input_signature=[tf.TensorSpec([None, None, None]), tf.TensorSpec([None, None, None, None])],
        jit_compile=True,
    )
    for length in [5, 130]:
        logits, values = _inputs(length, seed=11)
        mean, _ = fn(logits, values)
        ref, _ = causal_softmax_mean_reference(tf.cast(logits, tf.float64), tf.cast(values, tf.float64))
        np.testing.assert_allclose(mean, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window, form", [(None, "direct"), (None, "factored"), (None, None), (5, None), (40, None)])
def test_compiled_forms_match_the_reference(window, form):
    # XLA on TensorFlow (where the default is the direct form), jax.jit on JAX, eager on PyTorch.
    logits, values = _inputs(100, dtype="float64", seed=15)
    mask = tensor(np.random.default_rng(16).random((2, 100)) > 0.1)
    fn = compiled(lambda l, v, m: causal_softmax_mean(l, v, window=window, mask=m, chunk_size=CHUNK, form=form))
    mean, log_z, state = fn(logits, values, mask)
    want_mean, want_lz, want_state = causal_softmax_mean(
        logits, values, window=window, mask=mask, chunk_size=CHUNK, form=form
    )
    ref_mean, ref_lz = causal_softmax_mean_reference(logits, values, window=window, mask=mask)
    real = numpy(mask)[:, None, :]
    np.testing.assert_allclose((numpy(mean) - numpy(ref_mean)) * real[..., None], 0.0, atol=1e-10)
    np.testing.assert_allclose((numpy(log_z) - numpy(ref_lz)) * real, 0.0, atol=1e-10)
    for s, w in zip(state, want_state):
        np.testing.assert_allclose(numpy(s), numpy(w), rtol=1e-10, atol=1e-10)


def test_bad_window():
    logits, values = _inputs(4)
    with pytest.raises(ValueError, match="window"):
        causal_softmax_mean(logits, values, window=0)


@pytest.mark.parametrize("window, form", [(None, "factored"), (None, "direct"), (7, None), (1000, None)])
def test_100k_tokens_with_drifting_logits(window, form):
    # Logits drift from -80 to +80: any exp() of a raw logit sum would overflow.
    length = 100_000
    rng = np.random.default_rng(12)
    logits = np.linspace(-80.0, 80.0, length) + rng.normal(size=length)
    values = rng.normal(size=(length, 2))
    mean, log_z, _ = causal_softmax_mean(
        tensor(logits[None, None], "float32"),
        tensor(values[None, None], "float32"),
        window=window,
        form=form,
    )
    _assert_finite(mean, log_z)
    mean = numpy(mean)
    for i in [0, 1, 777, 50_000, length - 1]:
        lo = 0 if window is None else max(0, i - window + 1)
        w = np.exp(logits[lo : i + 1] - logits[lo : i + 1].max())
        want = w @ values[lo : i + 1] / w.sum()
        np.testing.assert_allclose(mean[0, 0, i], want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("length", [1, 37, 100])
@pytest.mark.parametrize("window", [None, 1, 5, 16, 40])
def test_document_starts_equal_each_document_run_apart(length, window):
    logits, values = _inputs(length, dtype="float64")
    prefix_l, prefix_v = _inputs(9, seed=1, dtype="float64")
    _, _, initial = causal_softmax_mean(prefix_l, prefix_v, window=window, chunk_size=CHUNK)
    document_starts = random_document_starts(2, length)
    cotangents = [np.random.default_rng(2).normal(size=values.shape), np.ones(logits.shape), None, None]

    def together(logits, values, *initial):
        mean, log_z, state = causal_softmax_mean(
            logits, values, window=window, initial_state=initial, document_starts=document_starts, chunk_size=CHUNK
        )
        return (mean, log_z, *state)

    def apart(logits, values, *initial):
        def call(inputs, state):
            mean, log_z, state = causal_softmax_mean(*inputs, window=window, initial_state=state, chunk_size=CHUNK)
            return (mean, log_z), state

        (mean, log_z), state = by_document(call, (logits, values), document_starts, initial)
        return (mean, log_z, *state)

    args = [logits, values, *initial]
    (got, got_grads), (want, want_grads) = (outputs_and_gradients(fn, args, cotangents) for fn in (together, apart))
    for g, w in zip(got + got_grads, want + want_grads):
        np.testing.assert_allclose(g, w, atol=1e-10)


def test_document_starts_in_float32_stay_exact_with_large_logits():
    logits, values = _inputs(100, scale=300.0)
    document_starts = random_document_starts(2, 100)
    mean, log_z, _ = causal_softmax_mean(logits, values, document_starts=document_starts, chunk_size=CHUNK)
    (want_mean, want_lz), _ = by_document(
        lambda x, s: (causal_softmax_mean(*x, initial_state=s, chunk_size=CHUNK)[:2], ()),
        (ops.cast(logits, "float64"), ops.cast(values, "float64")),
        document_starts,
        (),
    )
    _assert_finite(mean, log_z)
    np.testing.assert_allclose(numpy(mean), numpy(want_mean), atol=2e-5)
    np.testing.assert_allclose(numpy(log_z), numpy(want_lz), rtol=1e-6)


@pytest.mark.parametrize("form", ["factored", "direct"])
@pytest.mark.parametrize("length, chunk", [(1, 16), (63, 16), (100, 16), (257, 16), (1100, 2)])
@pytest.mark.parametrize("scale", [3.0, 80.0])
def test_each_form_matches_the_reference_outputs_and_gradients(form, length, chunk, scale):
    # 1,100 positions in chunks of 2 are 550 chunks: past the direct form's one-level carry (512), one level more.
    logits, values = _inputs(length, scale=scale, dtype="float64", seed=5)
    mask = np.random.default_rng(6).random((2, length)) > 0.1
    # Padded rows are left finite, not meaningful: compared at real positions only.
    got = _outputs_and_gradients(
        lambda l, v: causal_softmax_mean(l, v, mask=mask, chunk_size=chunk, form=form), logits, values, 7, mask
    )
    want = _outputs_and_gradients(
        lambda l, v: causal_softmax_mean_reference(l, v, mask=tensor(mask)), logits, values, 7, mask
    )
    for g, w in zip(got, want):
        _assert_finite(g)
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9 * scale)


def test_the_direct_form_is_causal_to_the_bit():
    logits, values = _arrays(70, scale=30.0)
    later = np.concatenate([logits[..., :40], logits[..., 40:] + 200.0], axis=-1)  # a jump far above, after row 39
    before, _, _ = causal_softmax_mean(tensor(logits, "float32"), tensor(values, "float32"), form="direct")
    after, _, _ = causal_softmax_mean(tensor(later, "float32"), tensor(values, "float32"), form="direct")
    np.testing.assert_array_equal(numpy(before)[:, :, :40], numpy(after)[:, :, :40])
    with pytest.raises(ValueError, match=r"`form` must be one of .*Received: form='fast'"):
        causal_softmax_mean(tensor(logits, "float32"), tensor(values, "float32"), form="fast")


@pytest.mark.tf_only
def test_the_direct_form_refuses_an_unknown_length():
    import tensorflow as tf

    unknown = tf.function(lambda l, v: causal_softmax_mean(l, v, form="direct")[0])
    with pytest.raises(ValueError, match="needs a length known at tracing"):
        unknown.get_concrete_function(tf.TensorSpec([2, 3, None]), tf.TensorSpec([2, 3, None, 4]))
