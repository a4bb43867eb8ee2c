import numpy as np
import pytest
from keras import ops

from elita_tf.ops.cross_entropy import chunked_cross_entropy
from elita_tf.ops.reference import cross_entropy_reference
from tests.backend_utils import BACKEND, compiled, numpy, outputs_and_gradients, tensor
from tests.ops.gradient_checks import compute_gradient, output_and_gradient_dtypes
from tests.ops.low_precision import assert_low_precision_follows_float32

CHUNK = 16


def _inputs(length, batch=2, width=8, vocab=37, seed=0, dtype="float64", spread=1.0):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(batch, length, width)).astype(dtype) * spread
    kernel = rng.normal(size=(width, vocab)).astype(dtype)
    bias = rng.normal(size=(vocab,)).astype(dtype)
    labels = rng.integers(0, vocab, size=(batch, length)).astype("int32")
    return hidden, kernel, bias, labels


def _loss_and_gradients(fn, hidden, kernel, bias, labels, reduction="none", **kwargs):
    """The loss and the gradients of `3 Σ c_n loss_n` for random weights `c`: per-token upstream gradients, or
    (`reduction="sum"`) the same weights given as `sample_weight`, under the scalar sum's upstream gradient of 3."""
    weights = np.random.default_rng(1).normal(size=labels.shape).astype(hidden.dtype)
    labels = tensor(labels)
    if reduction == "sum":

        def loss(h, k, b):
            return fn(h, k, labels, bias=b, sample_weight=tensor(weights), reduction="sum", **kwargs)

        cotangent = np.array(3.0, hidden.dtype)
    else:

        def loss(h, k, b):
            return fn(h, k, labels, bias=b, **kwargs)

        cotangent = 3.0 * weights
    (value,), grads = outputs_and_gradients(loss, [hidden, kernel, bias], [cotangent])
    return [value, *grads]


def _reference(hidden, kernel, labels, bias=None, sample_weight=None, reduction="none", **kwargs):
    losses = cross_entropy_reference(hidden, kernel, labels, bias=bias, **kwargs)
    if sample_weight is not None:
        losses = losses * sample_weight
    return ops.sum(losses) if reduction == "sum" else losses


def _chunked(*args, **kwargs):
    return chunked_cross_entropy(*args, chunk_size=CHUNK, **kwargs)


@pytest.mark.parametrize("reduction", ["none", "sum"])
@pytest.mark.parametrize("length", [1, 63, 100, 257])
@pytest.mark.parametrize("scale", [1.0, 8**-0.5])
def test_loss_and_gradients_match_reference(length, scale, reduction):
    # Per-token upstream gradients recompute the logits; the weighted sum's gradients come from its forward pass.
    inputs = _inputs(length)
    got = _loss_and_gradients(_chunked, *inputs, reduction=reduction, scale=scale)
    want = _loss_and_gradients(_reference, *inputs, reduction=reduction, scale=scale)
    assert got[0].shape == (inputs[3].shape if reduction == "none" else ())
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


def test_without_bias_equals_a_zero_bias():
    hidden, kernel, bias, labels = (tensor(x) for x in _inputs(20))
    np.testing.assert_allclose(
        numpy(_chunked(hidden, kernel, labels)), numpy(_chunked(hidden, kernel, labels, bias=ops.zeros_like(bias)))
    )


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_custom_gradient_passes_numerical_check(reduction):
    hidden, kernel, bias, labels = _inputs(5, width=3, vocab=7)
    labels = tensor(labels)
    theoretical, numerical = compute_gradient(
        lambda h, w, b: chunked_cross_entropy(h, w, labels, bias=b, scale=0.7, chunk_size=2, reduction=reduction),
        [hidden, kernel, bias],
    )
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-7)


def test_large_logits_stay_finite_and_exact():
    # Logits of order 1e4 would overflow exp() in float32 without the log-sum-exp shift.
    hidden, kernel, bias, labels = _inputs(40, spread=3000.0, dtype="float32")
    got = _loss_and_gradients(_chunked, hidden, kernel, bias, labels)
    want = _loss_and_gradients(cross_entropy_reference, hidden, kernel, bias, labels)
    assert np.all(np.isfinite(got[0])) and np.max(got[0]) > 1e3
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-2)


def test_float32_loss_is_exact_on_both_sides_of_the_underflow_switch(choice_form):
    # The loss is read from the softmax while the label's probability is a normal float; a chunk
    # holding a loss above 43.7 (probability below 1e-19) switches to the largest logit's form.
    vocab = 37
    hidden = np.eye(vocab)[None]  # token n's logits are row n of the kernel
    rng = np.random.default_rng(3)
    kernel = rng.normal(size=(vocab, vocab))
    labels = rng.integers(0, vocab, size=(1, vocab)).astype("int32")
    gaps = np.array([-20.0, -1.0, 0.0, 1.0, 20.0, 43.0, 44.0, 80.0, 300.0])  # how far each label's logit trails
    for n, gap in enumerate(gaps):
        kernel[n, labels[0, n]] = kernel[n].max() - gap
    want = numpy(cross_entropy_reference(tensor(hidden), tensor(kernel), tensor(labels)))  # float64
    for chunk_size in (8, 64):  # the large losses alone in a chunk, or with all the others
        got = chunked_cross_entropy(
            tensor(hidden, "float32"), tensor(kernel, "float32"), tensor(labels), chunk_size=chunk_size
        )
        np.testing.assert_allclose(numpy(got), want, rtol=1e-6, atol=2e-6)
    assert want[0, 0] < 1e-6 and want[0, 8] > 300


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_inputs_accumulate_in_float32(dtype):
    hidden, kernel, bias, labels = _inputs(50, dtype="float32")
    low = ops.cast(tensor(hidden), dtype)
    assert output_and_gradient_dtypes(lambda h: _chunked(h, tensor(kernel), tensor(labels), bias=tensor(bias)), [low]) == [
        "float32",
        dtype,
    ]
    got = _chunked(low, tensor(kernel), tensor(labels), bias=tensor(bias))
    want = cross_entropy_reference(ops.cast(low, "float32"), tensor(kernel), tensor(labels), bias=tensor(bias))
    np.testing.assert_allclose(numpy(got), numpy(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction", ["none", "sum"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_hidden_states_get_the_float32_gradient(dtype, reduction):
    # The mixed-precision path: 16-bit hidden states, float32 head. Without the hidden states'
    # gradient, a mixed-precision model would train its output layer alone.
    hidden, kernel, bias, labels = (tensor(x) for x in _inputs(50, dtype="float32"))

    def loss(h):
        return _chunked(h, kernel, labels, bias=bias, reduction=reduction)

    assert_low_precision_follows_float32(loss, [hidden], dtype)


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_compiled_matches_eager(reduction):
    """XLA on TensorFlow, `jax.jit` on JAX: the loop over chunks compiles, with the same values and gradients."""
    hidden, kernel, bias, labels = _inputs(70, dtype="float32")
    run = compiled(lambda h, k, b, y: _loss_and_gradients_tensors(h, k, b, y, reduction))
    eager = _loss_and_gradients(_chunked, hidden, kernel, bias, labels, reduction)
    for e, c in zip(eager, run(*(tensor(x) for x in (hidden, kernel, bias, labels)))):
        np.testing.assert_allclose(numpy(c), e, rtol=1e-5, atol=1e-5)


def _loss_and_gradients_tensors(hidden, kernel, bias, labels, reduction):
    """`_loss_and_gradients` as tensors, traceable by `compiled`: the backend's own gradient transform."""
    weights = ops.convert_to_tensor(np.random.default_rng(1).normal(size=labels.shape).astype("float32"))

    def total(h, k, b):
        """`(3 Σ c_n loss_n, the loss)`, as `_loss_and_gradients` takes them."""
        if reduction == "sum":
            value = _chunked(h, k, labels, bias=b, sample_weight=weights, reduction="sum")
            return 3.0 * value, value
        value = _chunked(h, k, labels, bias=b)
        return 3.0 * ops.sum(value * weights), value

    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch([hidden, kernel, bias])
            loss, value = total(hidden, kernel, bias)
        return [value, *tape.gradient(loss, [hidden, kernel, bias])]
    if BACKEND == "jax":
        import jax

        (_, value), grads = jax.value_and_grad(total, argnums=(0, 1, 2), has_aux=True)(hidden, kernel, bias)
        return [value, *grads]
    pytest.skip("PyTorch is checked eagerly (torch.compile takes minutes on a CPU)")


@pytest.mark.tf_only
@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_variables_get_their_gradients_inside_a_tf_function(reduction):
    import tensorflow as tf

    hidden, kernel, bias, labels = _inputs(30, dtype="float32")
    kernel_var, bias_var = tf.Variable(kernel), tf.Variable(bias)

    @tf.function
    def gradients():
        with tf.GradientTape() as tape:
            loss = _chunked(hidden, kernel_var, labels, bias=bias_var, reduction=reduction)
            loss = tf.reduce_mean(loss) if reduction == "none" else loss / tf.cast(tf.size(labels), loss.dtype)
        return tape.gradient(loss, [kernel_var, bias_var])

    kernel, bias = tf.constant(kernel), tf.constant(bias)
    with tf.GradientTape() as tape:
        tape.watch([kernel, bias])
        loss = tf.reduce_mean(cross_entropy_reference(hidden, kernel, labels, bias=bias))
    for got, want in zip(gradients(), tape.gradient(loss, [kernel, bias])):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_refuses_a_width_other_than_the_kernels():
    hidden, kernel, _, labels = (tensor(x) for x in _inputs(4))
    with pytest.raises(ValueError, match=r"hidden.shape=\(2, 4, 5\)"):
        chunked_cross_entropy(hidden[..., :5], kernel, labels)
    with pytest.raises(ValueError, match="chunk_size=0"):
        chunked_cross_entropy(hidden, kernel, labels, chunk_size=0)
    with pytest.raises(ValueError, match="reduction='mean'"):
        chunked_cross_entropy(hidden, kernel, labels, reduction="mean")


@pytest.mark.parametrize("label", [-1, -100, 37, 44])
def test_a_label_outside_the_vocabulary_is_refused_by_position_and_value(label):
    # -1 and -100 are other libraries' "ignore" labels: read as V - 1 or as nothing, they would train quietly.
    hidden, kernel, _, labels = _inputs(6, dtype="float32")
    labels[1, 4] = label
    for reduction in ("none", "sum"):
        with pytest.raises(ValueError, match=rf"Labels must be in \[0, vocabulary_size=37\).*sample_weight of 0.*"
                                             rf"Received: labels\[1, 4\]={label}$"):
            _chunked(tensor(hidden), tensor(kernel), tensor(labels), reduction=reduction)


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_a_label_outside_the_vocabulary_gives_a_nan_loss_where_no_check_runs(reduction):
    """Compiled (XLA drops assertions; `jax.jit` has none): the label's loss is NaN, the others' as eagerly."""
    if BACKEND == "torch":
        pytest.skip("PyTorch is checked eagerly (torch.compile takes minutes on a CPU)")
    hidden, kernel, _, labels = _inputs(6, dtype="float32")
    good = numpy(_chunked(tensor(hidden), tensor(kernel), tensor(labels)))
    labels[1, 4] = -100
    run = compiled(lambda h, k, y: _chunked(h, k, y, reduction=reduction))
    losses = numpy(run(tensor(hidden), tensor(kernel), tensor(labels)))
    if reduction == "sum":
        assert np.isnan(losses)
        return
    assert np.isnan(losses[1, 4])
    losses[1, 4] = good[1, 4]
    np.testing.assert_allclose(losses, good, rtol=1e-6)


@pytest.mark.tf_only
def test_a_label_outside_the_vocabulary_fails_a_tensorflow_graph_by_position_and_value():
    import tensorflow as tf

    hidden, kernel, _, labels = _inputs(6, dtype="float32")
    labels[0, 2] = 40
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Labels must be in \[0, vocabulary_size=37\)(.|\n)*"
                                                             r"\[40\] \[at\] \[\[0 2\]\]"):
        tf.function(lambda y: _chunked(hidden, kernel, y, reduction="sum"))(tf.constant(labels))
