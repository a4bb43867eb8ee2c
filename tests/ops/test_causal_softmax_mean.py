import numpy as np
import pytest
import tensorflow as tf

from elita_tf.ops import causal_softmax_mean, causal_softmax_mean_step, empty_softmax_mean_state
from elita_tf.ops.reference import causal_softmax_mean_reference
from tests.ops.documents import by_document, random_document_starts
from tests.ops.low_precision import assert_low_precision_follows_float32

LENGTHS = [1, 63, 100, 257]
# Smaller and larger than the chunk (16 in these tests, 32 by default): whole chunks (32), one
# chunk and a part (21), and more chunks than a chunk holds (300: whole chunks in windows again).
WINDOWS = [None, 1, 5, 16, 21, 32, 40, 300]
CHUNK = 16


def _inputs(length, scale=3.0, batch=2, heads=3, depth=4, seed=0, dtype=tf.float32):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(batch, heads, length)) * scale
    values = rng.normal(size=(batch, heads, length, depth))
    return tf.constant(logits, dtype), tf.constant(values, dtype)


def _assert_finite(*tensors):
    for t in tensors:
        assert np.all(np.isfinite(t.numpy())), "non-finite values"


def _outputs_and_gradients(fn, logits, values, seed, real=None):
    """`fn`'s mean and log-normaliser and the gradients of a random projection of them; `real` (`[B, T]`
    0/1) keeps those positions only."""
    rng = np.random.default_rng(seed)
    cot_mean = tf.constant(rng.normal(size=values.shape), values.dtype)
    cot_lz = tf.constant(rng.normal(size=logits.shape), logits.dtype)
    real = tf.ones([logits.shape[0], logits.shape[2]], logits.dtype) if real is None else tf.cast(real, logits.dtype)
    real = real[:, None, :]
    with tf.GradientTape() as tape:
        tape.watch([logits, values])
        mean, log_z = fn(logits, values)[:2]
        loss = tf.reduce_sum(mean * cot_mean * real[..., None]) + tf.reduce_sum(log_z * cot_lz * real)
    return [mean * real[..., None], log_z * real, *tape.gradient(loss, [logits, values])]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("window", WINDOWS)
def test_forward_matches_reference_float64(length, window):
    logits, values = _inputs(length, dtype=tf.float64)
    mean, log_z, _ = causal_softmax_mean(logits, values, window=window, chunk_size=CHUNK)
    ref_mean, ref_log_z = causal_softmax_mean_reference(logits, values, window=window)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(log_z, ref_log_z, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("window", WINDOWS)
def test_gradients_match_reference(length, window):
    logits, values = _inputs(length, dtype=tf.float64, seed=1)
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
    logits, values = _inputs(257, scale=40.0, dtype=tf.float64, seed=3)
    logits = tf.clip_by_value(logits, -80.0, 80.0)
    with tf.GradientTape() as tape:
        l32 = tf.cast(logits, tf.float32)
        tape.watch(l32)
        mean, log_z, _ = causal_softmax_mean(l32, tf.cast(values, tf.float32), window=window, chunk_size=CHUNK)
        loss = tf.reduce_sum(mean) + tf.reduce_sum(log_z)
    grad = tape.gradient(loss, l32)
    _assert_finite(mean, log_z, grad)
    ref_mean, ref_log_z = causal_softmax_mean_reference(logits, values, window=window)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(log_z, ref_log_z, rtol=1e-5, atol=1e-4)


def test_early_rows_survive_a_late_huge_logit(choice_form):
    # A single global max would underflow every earlier row to 0/0.
    logits = tf.constant([[[-80.0] * 70 + [80.0] + [-80.0] * 30]])
    values = tf.random.stateless_normal([1, 1, 101, 2], seed=[0, 1])
    mean, _, _ = causal_softmax_mean(logits, values, chunk_size=CHUNK)
    ref, _ = causal_softmax_mean_reference(tf.cast(logits, tf.float64), tf.cast(values, tf.float64))
    np.testing.assert_allclose(mean, ref, rtol=1e-5, atol=1e-5)


def test_custom_grad_free_path_passes_numeric_gradient_check():
    logits, values = _inputs(21, batch=1, heads=1, depth=2, dtype=tf.float64, seed=4)
    for window in [None, 4, 19]:
        theory, numeric = tf.test.compute_gradient(
            lambda l, v: causal_softmax_mean(l, v, window=window, chunk_size=8)[0], [logits, values]
        )
        for t, n in zip(theory, numeric):
            np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("window", [None, 5, 40])
def test_causality(window):
    logits, values = _inputs(100, seed=5)
    mean, log_z, _ = causal_softmax_mean(logits, values, window=window, chunk_size=CHUNK)
    t = 37
    changed_l = tf.concat([logits[..., : t + 1], logits[..., t + 1 :] + 50.0], axis=-1)
    changed_v = tf.concat([values[:, :, : t + 1], -values[:, :, t + 1 :]], axis=2)
    mean2, log_z2, _ = causal_softmax_mean(changed_l, changed_v, window=window, chunk_size=CHUNK)
    np.testing.assert_array_equal(mean[:, :, : t + 1], mean2[:, :, : t + 1])
    np.testing.assert_array_equal(log_z[:, :, : t + 1], log_z2[:, :, : t + 1])


@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("with_resets", [False, True])
def test_rows_before_any_real_position_stay_causal(window, with_resets):
    # Their normaliser is NEG_INF, so `l_j - L_i` is about -NEG_INF for a later real key: the mask must still win.
    logits, values = _inputs(40, seed=10)
    mask = np.ones((2, 40), bool)
    mask[:, :5] = False
    document_starts = np.zeros((2, 40), bool) if with_resets else None
    if with_resets:
        document_starts[:, 20] = True
    kwargs = dict(window=window, mask=mask, chunk_size=CHUNK, document_starts=document_starts)
    mean, _, _ = causal_softmax_mean(logits, values, **kwargs)
    t = 3
    changed_v = tf.concat([values[:, :, : t + 1], values[:, :, t + 1 :] + 100.0], axis=2)
    mean2, _, _ = causal_softmax_mean(logits, changed_v, **kwargs)
    _assert_finite(mean)
    np.testing.assert_array_equal(mean[:, :, : t + 1], mean2[:, :, : t + 1])


@pytest.mark.parametrize("dtype, rise", [(tf.float32, 150.0), (tf.float64, 1000.0)])
def test_a_logit_past_the_span_switches_its_rows_exactly_and_causally(dtype, rise, choice_form):
    # Position 40 rises further above its chunk's reference than the factored weights allow (e^80
    # in float32, e^700 in float64): its rows take the exponential forms, the rows before stay
    # bit for bit what they were without it, and everything equals the reference.
    logits, values = _inputs(100, seed=13, dtype=dtype)
    t = 40
    high = tf.concat([logits[..., :t], logits[..., t : t + 1] + rise, logits[..., t + 1 :]], axis=-1)
    cot_mean = tf.constant(np.random.default_rng(14).normal(size=values.shape), dtype)

    def run(l):
        with tf.GradientTape() as tape:
            tape.watch([l, values])
            mean, log_z, _ = causal_softmax_mean(l, values, chunk_size=CHUNK)
            loss = tf.reduce_sum(mean * cot_mean) + tf.reduce_sum(log_z)
        return mean, log_z, tape.gradient(loss, [l, values])

    mean, log_z, _ = run(logits)
    high_mean, high_lz, grads = run(high)
    _assert_finite(high_mean, high_lz, *grads)
    np.testing.assert_array_equal(high_mean[:, :, :t], mean[:, :, :t])
    np.testing.assert_array_equal(high_lz[:, :, :t], log_z[:, :, :t])

    with tf.GradientTape() as tape:
        l64, v64 = tf.cast(high, tf.float64), tf.cast(values, tf.float64)
        tape.watch([l64, v64])
        ref_mean, ref_lz = causal_softmax_mean_reference(l64, v64)
        loss = tf.reduce_sum(ref_mean * tf.cast(cot_mean, tf.float64)) + tf.reduce_sum(ref_lz)
    ref_grads = tape.gradient(loss, [l64, v64])
    tol = 1e-5 if dtype == tf.float32 else 1e-10
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
    np.testing.assert_allclose(tf.concat(means, 2), full_mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tf.concat(lzs, 2), full_lz, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 6])
def test_steps_from_empty_state(window):
    logits, values = _inputs(12, seed=7)
    full_mean, _, _ = causal_softmax_mean(logits, values, window=window)
    state = empty_softmax_mean_state(2, 3, 4, window=window)
    for t in range(12):
        mean, _, state = causal_softmax_mean_step(state, logits[..., t], values[:, :, t], window=window)
        np.testing.assert_allclose(mean, full_mean[:, :, t], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [None, 3, 40])
def test_masked_positions_contribute_nothing(window):
    logits, values = _inputs(70, seed=8)
    mask = np.ones((2, 70), bool)
    mask[0, 10:20] = False
    mask[1, :5] = False
    mean, log_z, _ = causal_softmax_mean(logits, values, window=window, mask=mask, chunk_size=CHUNK)
    # Garbage at masked positions must not leak.
    noisy_l = tf.where(mask[:, None], logits, 1e4)
    noisy_v = tf.where(mask[:, None, :, None], values, 1e4)
    mean2, _, _ = causal_softmax_mean(noisy_l, noisy_v, window=window, mask=mask, chunk_size=CHUNK)
    ref_mean, ref_lz = causal_softmax_mean_reference(
        tf.cast(logits, tf.float64), tf.cast(values, tf.float64), window=window, mask=mask
    )
    _assert_finite(mean, mean2, log_z)
    # Rows that see at least one real position equal the reference.
    seen = (
        causal_softmax_mean_reference(tf.zeros_like(ref_lz), tf.ones_like(ref_mean[..., :1]), window=window, mask=mask)[
            1
        ]
        > -1e30
    )
    rows = seen.numpy()
    np.testing.assert_allclose(mean.numpy()[rows], ref_mean.numpy()[rows], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean2.numpy()[rows], ref_mean.numpy()[rows], rtol=1e-5, atol=1e-5)


def test_masked_step_leaves_global_state_unchanged():
    logits, values = _inputs(3, seed=9)
    state = empty_softmax_mean_state(2, 3, 4)
    _, _, state = causal_softmax_mean_step(state, logits[..., 0], values[:, :, 0])
    _, _, after = causal_softmax_mean_step(state, logits[..., 1], values[:, :, 1], mask=tf.constant([False, True]))
    np.testing.assert_array_equal(after[0][0], state[0][0])
    np.testing.assert_array_equal(after[1][0], state[1][0])
    assert not np.allclose(after[1][1], state[1][1])


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_low_precision_inputs_accumulate_in_float32(dtype):
    logits, values = _inputs(4096, scale=20.0, batch=1, heads=2, seed=10)
    mean, log_z, state = causal_softmax_mean(tf.cast(logits, dtype), tf.cast(values, dtype), window=None)
    assert mean.dtype == tf.float32 and log_z.dtype == tf.float32
    _assert_finite(mean, log_z, *state)


@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_low_precision_outputs_and_gradients_follow_float32(dtype, window):
    logits, values = _inputs(100, scale=3.0)
    assert_low_precision_follows_float32(
        lambda l, v: causal_softmax_mean(l, v, window=window, chunk_size=CHUNK), [logits, values], dtype
    )


@pytest.mark.parametrize("window", [None, 5, 300])
def test_empty_sequence(window):
    logits, values = _inputs(0)
    mean, log_z, state = causal_softmax_mean(logits, values, window=window)
    assert mean.shape == (2, 3, 0, 4) and log_z.shape == (2, 3, 0)
    empty = empty_softmax_mean_state(2, 3, 4, window=window)
    for s, e in zip(state, empty):
        np.testing.assert_array_equal(s, e)


def test_compiles_with_dynamic_length_and_xla():
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
        tf.constant(logits[None, None], tf.float32),
        tf.constant(values[None, None], tf.float32),
        window=window,
        form=form,
    )
    _assert_finite(mean, log_z)
    for i in [0, 1, 777, 50_000, length - 1]:
        lo = 0 if window is None else max(0, i - window + 1)
        w = np.exp(logits[lo : i + 1] - logits[lo : i + 1].max())
        want = w @ values[lo : i + 1] / w.sum()
        np.testing.assert_allclose(mean[0, 0, i], want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("length", [1, 37, 100])
@pytest.mark.parametrize("window", [None, 1, 5, 16, 40])
def test_document_starts_equal_each_document_run_apart(length, window):
    logits, values = _inputs(length, dtype=tf.float64)
    prefix_l, prefix_v = _inputs(9, seed=1, dtype=tf.float64)
    _, _, initial = causal_softmax_mean(prefix_l, prefix_v, window=window, chunk_size=CHUNK)
    document_starts = random_document_starts(2, length)
    cotangent = tf.constant(np.random.default_rng(2).normal(size=values.shape))

    def run(fn):
        with tf.GradientTape() as tape:
            tape.watch([logits, values, *initial])
            (mean, log_z), state = fn()
            loss = tf.reduce_sum(mean * cotangent) + tf.reduce_sum(log_z)
        return [mean, log_z, *state, *tape.gradient(loss, [logits, values, *initial])]

    def apart(inputs, state):
        mean, log_z, state = causal_softmax_mean(*inputs, window=window, initial_state=state, chunk_size=CHUNK)
        return (mean, log_z), state

    def together():
        mean, log_z, state = causal_softmax_mean(
            logits, values, window=window, initial_state=initial, document_starts=document_starts, chunk_size=CHUNK
        )
        return (mean, log_z), state

    got, want = run(together), run(lambda: by_document(apart, (logits, values), document_starts, initial))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), 0.0 if w is None else w.numpy(), atol=1e-10)


def test_document_starts_in_float32_stay_exact_with_large_logits():
    logits, values = _inputs(100, scale=300.0)
    document_starts = random_document_starts(2, 100)
    mean, log_z, _ = causal_softmax_mean(logits, values, document_starts=document_starts, chunk_size=CHUNK)
    (want_mean, want_lz), _ = by_document(
        lambda x, s: (causal_softmax_mean(*x, initial_state=s, chunk_size=CHUNK)[:2], ()),
        (tf.cast(logits, tf.float64), tf.cast(values, tf.float64)),
        document_starts,
        (),
    )
    _assert_finite(mean, log_z)
    np.testing.assert_allclose(mean.numpy(), want_mean.numpy(), atol=2e-5)
    np.testing.assert_allclose(log_z.numpy(), want_lz.numpy(), rtol=1e-6)


@pytest.mark.parametrize("form", ["factored", "direct"])
@pytest.mark.parametrize("length, chunk", [(1, 16), (63, 16), (100, 16), (257, 16), (1100, 2)])
@pytest.mark.parametrize("scale", [3.0, 80.0])
def test_each_form_matches_the_reference_outputs_and_gradients(form, length, chunk, scale):
    # 1,100 positions in chunks of 2 are 550 chunks: past the direct form's one-level carry (512), one level more.
    logits, values = _inputs(length, scale=scale, dtype=tf.float64, seed=5)
    mask = tf.constant(np.random.default_rng(6).random((2, length)) > 0.1)
    # Padded rows are left finite, not meaningful: compared at real positions only.
    got = _outputs_and_gradients(
        lambda l, v: causal_softmax_mean(l, v, mask=mask, chunk_size=chunk, form=form), logits, values, 7, mask
    )
    want = _outputs_and_gradients(lambda l, v: causal_softmax_mean_reference(l, v, mask=mask), logits, values, 7, mask)
    for g, w in zip(got, want):
        _assert_finite(g)
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9 * scale)


def test_the_direct_form_is_causal_to_the_bit_and_refuses_an_unknown_length():
    logits, values = _inputs(70, scale=30.0)
    later = tf.concat([logits[..., :40], logits[..., 40:] + 200.0], axis=-1)  # a jump far above, after row 39
    before, _, _ = causal_softmax_mean(logits, values, form="direct")
    after, _, _ = causal_softmax_mean(later, values, form="direct")
    np.testing.assert_array_equal(before[:, :, :40], after[:, :, :40])
    with pytest.raises(ValueError, match=r"`form` must be one of .*Received: form='fast'"):
        causal_softmax_mean(logits, values, form="fast")
    unknown = tf.function(lambda l, v: causal_softmax_mean(l, v, form="direct")[0])
    with pytest.raises(ValueError, match="needs a length known at tracing"):
        unknown.get_concrete_function(tf.TensorSpec([2, 3, None]), tf.TensorSpec([2, 3, None, 4]))
