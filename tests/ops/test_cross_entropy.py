import numpy as np
import pytest
import tensorflow as tf

from elita_tf.ops.cross_entropy import chunked_cross_entropy
from elita_tf.ops.reference import cross_entropy_reference
from tests.ops.low_precision import assert_low_precision_follows_float32

# The chunked loss is the model's, TensorFlow's alone until the model runs on every backend.
pytestmark = pytest.mark.tf_only

CHUNK = 16


def _inputs(length, batch=2, width=8, vocab=37, seed=0, dtype=tf.float64, spread=1.0):
    rng = np.random.default_rng(seed)
    hidden = tf.constant(rng.normal(size=(batch, length, width)) * spread, dtype)
    kernel = tf.constant(rng.normal(size=(width, vocab)), dtype)
    bias = tf.constant(rng.normal(size=(vocab,)), dtype)
    labels = tf.constant(rng.integers(0, vocab, size=(batch, length)), tf.int32)
    return hidden, kernel, bias, labels


def _loss_and_gradients(fn, hidden, kernel, bias, labels, reduction="none", **kwargs):
    """The loss and the gradients of `Σ c_n loss_n` for random weights `c`: per-token upstream gradients, or
    (`reduction="sum"`) the same weights given as `sample_weight`, under the scalar sum's upstream gradient of 3."""
    cotangent = tf.constant(np.random.default_rng(1).normal(size=labels.shape), hidden.dtype)
    with tf.GradientTape() as tape:
        tape.watch([hidden, kernel, bias])
        if reduction == "sum":
            loss = fn(hidden, kernel, labels, bias=bias, sample_weight=cotangent, reduction="sum", **kwargs)
            total = 3.0 * tf.cast(loss, hidden.dtype)
        else:
            loss = fn(hidden, kernel, labels, bias=bias, **kwargs)
            total = 3.0 * tf.reduce_sum(tf.cast(loss, hidden.dtype) * cotangent)
    return [loss] + tape.gradient(total, [hidden, kernel, bias])


def _reference(hidden, kernel, labels, bias=None, sample_weight=None, reduction="none", **kwargs):
    losses = cross_entropy_reference(hidden, kernel, labels, bias=bias, **kwargs)
    if sample_weight is not None:
        losses = losses * sample_weight
    return tf.reduce_sum(losses) if reduction == "sum" else losses


@pytest.mark.parametrize("reduction", ["none", "sum"])
@pytest.mark.parametrize("length", [1, 63, 100, 257])
@pytest.mark.parametrize("scale", [1.0, 8**-0.5])
def test_loss_and_gradients_match_reference(length, scale, reduction):
    # Per-token upstream gradients recompute the logits; the weighted sum's gradients come from its forward pass.
    inputs = _inputs(length)
    chunked = lambda *a, **k: chunked_cross_entropy(*a, chunk_size=CHUNK, **k)  # noqa: E731
    got = _loss_and_gradients(chunked, *inputs, reduction=reduction, scale=scale)
    want = _loss_and_gradients(_reference, *inputs, reduction=reduction, scale=scale)
    assert got[0].shape == (inputs[3].shape if reduction == "none" else ())
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


def test_without_bias_equals_a_zero_bias():
    hidden, kernel, bias, labels = _inputs(20)
    np.testing.assert_allclose(
        chunked_cross_entropy(hidden, kernel, labels, chunk_size=CHUNK),
        chunked_cross_entropy(hidden, kernel, labels, bias=tf.zeros_like(bias), chunk_size=CHUNK),
    )


def test_custom_gradient_passes_numerical_check():
    hidden, kernel, bias, labels = _inputs(5, width=3, vocab=7)
    for reduction in ("none", "sum"):
        theoretical, numerical = tf.test.compute_gradient(
            lambda h, w, b: chunked_cross_entropy(h, w, labels, bias=b, scale=0.7, chunk_size=2, reduction=reduction),
            [hidden, kernel, bias],
        )
        for t, n in zip(theoretical, numerical):
            np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-7)


def test_large_logits_stay_finite_and_exact():
    # Logits of order 1e4 would overflow exp() in float32 without the log-sum-exp shift.
    hidden, kernel, bias, labels = _inputs(40, spread=3000.0, dtype=tf.float32)
    got = _loss_and_gradients(
        lambda *a, **k: chunked_cross_entropy(*a, chunk_size=CHUNK, **k), hidden, kernel, bias, labels
    )
    want = _loss_and_gradients(cross_entropy_reference, hidden, kernel, bias, labels)
    assert np.all(np.isfinite(got[0])) and np.max(got[0]) > 1e3
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-2)


def test_float32_loss_is_exact_on_both_sides_of_the_underflow_switch(choice_form):
    # The loss is read from the softmax while the label's probability is a normal float; a chunk
    # holding a loss above 43.7 (probability below 1e-19) switches to the largest logit's form.
    vocab = 37
    hidden = tf.eye(vocab, dtype=tf.float64)[None]  # token n's logits are row n of the kernel
    rng = np.random.default_rng(3)
    kernel = rng.normal(size=(vocab, vocab))
    labels = rng.integers(0, vocab, size=(1, vocab))
    gaps = np.array([-20.0, -1.0, 0.0, 1.0, 20.0, 43.0, 44.0, 80.0, 300.0])  # how far each label's logit trails
    for n, gap in enumerate(gaps):
        kernel[n, labels[0, n]] = kernel[n].max() - gap
    kernel, labels = tf.constant(kernel), tf.constant(labels, tf.int32)
    want = cross_entropy_reference(hidden, kernel, labels)  # float64
    for chunk_size in (8, 64):  # the large losses alone in a chunk, or with all the others
        got = chunked_cross_entropy(
            tf.cast(hidden, tf.float32), tf.cast(kernel, tf.float32), labels, chunk_size=chunk_size
        )
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-6)
    assert want[0, 0] < 1e-6 and want[0, 8] > 300


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_low_precision_inputs_accumulate_in_float32(dtype):
    hidden, kernel, bias, labels = _inputs(50, dtype=tf.float32)
    low = tf.cast(hidden, dtype)
    got = _loss_and_gradients(
        lambda *a, **k: chunked_cross_entropy(*a, chunk_size=CHUNK, **k), low, kernel, bias, labels
    )
    assert got[0].dtype == tf.float32 and got[1].dtype == dtype and got[2].dtype == tf.float32
    want = cross_entropy_reference(tf.cast(low, tf.float32), kernel, labels, bias=bias)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction", ["none", "sum"])
@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_low_precision_hidden_states_get_the_float32_gradient(dtype, reduction):
    # The mixed-precision path: 16-bit hidden states, float32 head. Without the hidden states'
    # gradient, a mixed-precision model would train its output layer alone.
    hidden, kernel, bias, labels = _inputs(50, dtype=tf.float32)

    def loss(h, k, b):
        return chunked_cross_entropy(h, k, labels, bias=b, chunk_size=CHUNK, reduction=reduction)

    assert_low_precision_follows_float32(lambda h: loss(h, kernel, bias), [hidden], dtype)


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_under_xla_matches_eager(reduction):
    hidden, kernel, bias, labels = _inputs(70, dtype=tf.float32)
    run = lambda *a, **k: chunked_cross_entropy(*a, chunk_size=CHUNK, **k)  # noqa: E731
    eager = _loss_and_gradients(run, hidden, kernel, bias, labels, reduction)
    compiled = tf.function(lambda *a: _loss_and_gradients(run, *a, reduction), jit_compile=True)(
        hidden, kernel, bias, labels
    )
    for e, c in zip(eager, compiled):
        np.testing.assert_allclose(c, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_variables_get_their_gradients_inside_a_tf_function(reduction):
    hidden, kernel, bias, labels = _inputs(30, dtype=tf.float32)
    kernel_var, bias_var = tf.Variable(kernel), tf.Variable(bias)

    @tf.function
    def gradients():
        with tf.GradientTape() as tape:
            loss = chunked_cross_entropy(
                hidden, kernel_var, labels, bias=bias_var, chunk_size=CHUNK, reduction=reduction
            )
            loss = tf.reduce_mean(loss) if reduction == "none" else loss / tf.cast(tf.size(labels), loss.dtype)
        return tape.gradient(loss, [kernel_var, bias_var])

    with tf.GradientTape() as tape:
        tape.watch([kernel, bias])
        loss = tf.reduce_mean(cross_entropy_reference(hidden, kernel, labels, bias=bias))
    for got, want in zip(gradients(), tape.gradient(loss, [kernel, bias])):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_refuses_a_width_other_than_the_kernels():
    hidden, kernel, _, labels = _inputs(4)
    with pytest.raises(ValueError, match=r"hidden.shape=\(2, 4, 5\)"):
        chunked_cross_entropy(hidden[..., :5], kernel, labels)
    with pytest.raises(ValueError, match="chunk_size=0"):
        chunked_cross_entropy(hidden, kernel, labels, chunk_size=0)
    with pytest.raises(ValueError, match="reduction='mean'"):
        chunked_cross_entropy(hidden, kernel, labels, reduction="mean")
