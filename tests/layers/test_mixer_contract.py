"""What every causal sequence layer guarantees, whatever it computes: non-finite inputs stay
causal, padding reaches no output, mixed-precision decoding works, bad calls are refused."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from elita_tf.layers import (
    AdditiveAttention,
    Attention2,
    LinearAttention,
    ShapedAttention,
    SimplifiedBlock,
    TransformerBlock,
    TriLinearAttention,
)

WIDTH = 16
MIXERS = {
    "attention2": lambda: Attention2(2, 8, 4),
    "linear": lambda: LinearAttention(2, 8),
    "additive_global": lambda: AdditiveAttention(2),
    "additive_window_8": lambda: AdditiveAttention(2, window=8),
    "additive_window_40": lambda: AdditiveAttention(2, window=40),
    "transformer": lambda: TransformerBlock(2, max_length=128),
    "shaped": lambda: ShapedAttention(2, max_length=128),
    "simplified": lambda: SimplifiedBlock(2, max_length=128),
    # The Combiner starts at zero (the layer is the identity): give it weights that show a leak.
    "3lin": lambda: TriLinearAttention(16, 16, window=8, max_length=128, combiner_initializer="glorot_uniform"),
    "3lin_wide": lambda: TriLinearAttention(
        16, 16, window=8, wide=True, max_length=128, combiner_initializer="glorot_uniform"
    ),
}


def _mixer(name):
    keras.utils.set_random_seed(0)
    layer = MIXERS[name]()
    layer.build((None, None, WIDTH))
    for w in layer.weights:  # zero-initialised queries and kernels made non-trivial
        if len(w.shape) > 1 and np.all(w.numpy() == 0):
            w.assign(np.random.default_rng(1).normal(size=w.shape) * 0.3)
    return layer


def _inputs(length=100, batch=2):
    return np.random.default_rng(0).normal(size=(batch, length, WIDTH)).astype("float32")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_a_nonfinite_input_never_changes_earlier_rows(name, bad):
    layer = _mixer(name)
    x = _inputs()
    spoiled = x.copy()
    spoiled[0, 50, 3] = bad  # one channel of one position, in the middle of a chunk
    clean, y = layer(x).numpy(), layer(spoiled).numpy()
    np.testing.assert_array_equal(y[0, :50], clean[0, :50])  # exactly: nothing travelled back
    assert np.isnan(y[0, 50:]).all()  # and nothing after it looks valid
    np.testing.assert_array_equal(y[1], clean[1])  # the other sequence is untouched


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_padded_positions_reach_no_output_whatever_they_hold(name):
    layer = _mixer(name)
    x = _inputs()
    mask = np.ones((2, 100), bool)
    mask[:, 35:40] = False
    mask[1, :3] = False  # left padding too
    noisy = x.copy()
    noisy[:, 35:40] = np.nan
    noisy[1, :3] = np.inf
    zeros = np.where(mask[..., None], x, 0.0).astype("float32")
    y, want = layer(noisy, padding_mask=mask).numpy(), layer(zeros, padding_mask=mask).numpy()
    assert np.isfinite(y[mask]).all()
    np.testing.assert_allclose(y[mask], want[mask], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_decoding_after_a_nonfinite_input_agrees_with_the_parallel_form(name):
    layer = _mixer(name)
    x = _inputs(12)
    x[:, 5] = np.nan
    parallel = layer(x).numpy()
    y, cache = layer(x[:, :8], cache=layer.get_initial_cache(2))
    steps = [y.numpy()]
    for t in range(8, 12):
        y, cache = layer(x[:, t : t + 1], cache=cache)
        steps.append(y.numpy())
    decoded = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(decoded[:, :5], parallel[:, :5], rtol=1e-4, atol=1e-4)
    assert np.isnan(decoded[:, 5:]).all() and np.isnan(parallel[:, 5:]).all()


@pytest.mark.parametrize("policy_name", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_mixed_precision_prefill_and_steps_equal_the_parallel_form(name, policy_name, policy):
    policy(policy_name)
    layer = _mixer(name)
    x = _inputs(20)
    initial = layer.get_initial_cache(2)
    y, cache = layer(x[:, :16], cache=initial)
    rows = [y]
    for t in range(16, 20):
        y, cache = layer(x[:, t : t + 1], cache=cache)
        rows.append(y)
    # A cache keeps the dtypes it was made with (float32 recurrent states, not the compute dtype).
    assert [t.dtype for t in tf.nest.flatten(cache)] == [t.dtype for t in tf.nest.flatten(initial)]
    decoded = np.concatenate([tf.cast(r, tf.float32).numpy() for r in rows], axis=1)
    parallel = tf.cast(layer(x), tf.float32).numpy()
    assert decoded.dtype == np.float32 and np.isfinite(decoded).all()
    tolerance = 0.05 if policy_name == "mixed_bfloat16" else 5e-3
    np.testing.assert_allclose(decoded, parallel, rtol=tolerance, atol=tolerance * np.abs(parallel).max())


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_bad_calls_are_refused_with_the_value(name):
    layer = _mixer(name)
    x = _inputs(10)
    with pytest.raises(ValueError, match=r"(ndim=3|\[batch, time, width\]).*\(10, 16\)"):
        layer(x[0])
    with pytest.raises(TypeError, match="int32"):
        layer(tf.zeros([2, 10, WIDTH], tf.int32))
    with pytest.raises(ValueError, match=r"padding_mask.*Received: padding_mask.shape=\(2, 9\)"):
        layer(x, padding_mask=np.ones((2, 9), bool))
    with pytest.raises(TypeError, match="padding_mask.dtype=float32"):
        layer(x, padding_mask=np.ones((2, 10), "float32"))
    with pytest.raises(ValueError, match="made for batch size 1.*batch size 2"):
        layer(x, cache=layer.get_initial_cache(1))
    cache = tf.nest.flatten(layer.get_initial_cache(2))
    with pytest.raises(ValueError, match=f"expects a cache of {len(cache)} tensors"):
        layer(x, cache=tuple(cache) + (tf.zeros([2]),))


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_a_padded_decoding_step_holding_nan_changes_nothing(name):
    layer = _mixer(name)
    x = _inputs(12)
    y, cache = layer(x[:, :8], cache=layer.get_initial_cache(2))
    _, padded = layer(np.full((2, 1, WIDTH), np.nan, "float32"), padding_mask=np.zeros((2, 1), bool), cache=cache)
    _, zeros = layer(np.zeros((2, 1, WIDTH), "float32"), padding_mask=np.zeros((2, 1), bool), cache=cache)
    for a, b in zip(tf.nest.flatten(padded), tf.nest.flatten(zeros)):
        np.testing.assert_array_equal(a, b)
    y, _ = layer(x[:, 8:9], cache=padded)
    assert np.isfinite(y).all()
