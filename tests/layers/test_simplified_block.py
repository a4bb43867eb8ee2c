import numpy as np
import keras
import pytest
import tensorflow as tf

from elita_tf.layers.simplified_block import SimplifiedBlock
from elita_tf.layers.wide_feedforward import WideFeedForward

WIDTH = 8


def _rms(x, layer):
    x = tf.cast(x, tf.float64)
    scale = tf.cast(tf.convert_to_tensor(layer.scale), tf.float64)
    return x * tf.math.rsqrt(tf.reduce_mean(x**2, -1, keepdims=True) + layer.epsilon) * scale


@pytest.mark.parametrize("variant", ["parallel", "sequential"])
def test_block_equations(variant):
    block = SimplifiedBlock(2, variant=variant, dtype="float64")
    block.build((None, None, WIDTH))
    rng = np.random.default_rng(0)
    for var in block.weights:
        var.assign(rng.normal(size=var.shape) * 0.5 + 1.0)
    x = tf.constant(rng.normal(size=(2, 37, WIDTH)))
    w = lambda v: tf.convert_to_tensor(v)  # noqa: E731
    mlp = lambda t: tf.nn.relu(t @ w(block.ffn_inner.kernel)) @ w(block.ffn_output.kernel)  # noqa: E731
    xn = _rms(x, block.attention_norm)
    h = w(block.attention_scale) * block.attention(xn)
    if variant == "parallel":
        want = h + w(block.ffn_scale) * mlp(xn)
    else:
        want = h + w(block.ffn_scale) * mlp(_rms(h, block.ffn_norm))
    np.testing.assert_allclose(block(x), want, rtol=1e-10, atol=1e-10)


def test_initial_gains_and_decoding():
    block = SimplifiedBlock(2, variant="sequential", value_projection=True, max_length=64)
    x = tf.random.stateless_normal([2, 40, WIDTH], seed=[1, 2])
    full = block(x)
    assert float(block.attention_scale) == 1.0 and float(block.ffn_scale) == pytest.approx(0.1)
    cache = block.get_initial_cache(2)
    outs = []
    for start, stop in [(0, 20), (20, 30)] + [(t, t + 1) for t in range(30, 40)]:
        y, cache = block(x[:, start:stop], cache=cache)
        outs.append(y)
    np.testing.assert_allclose(tf.concat(outs, 1), full, rtol=1e-5, atol=1e-5)


def test_shared_wide_feedforward_stays_shared_after_save(tmp_path):
    layers, width = 3, WIDTH
    shared = WideFeedForward(num_layers=layers, name="wide")
    inputs = keras.Input((None, width))
    x = inputs
    for i in range(layers):
        attention = SimplifiedBlock(2, feedforward=False, name=f"block_{i}")(x)
        x = attention + shared(keras.layers.LayerNormalization(name=f"ffn_norm_{i}")(x))
    model = keras.Model(inputs, x)
    assert shared.inner.kernel.shape == (width, 4 * width * layers)
    wide_params = shared.count_params()
    assert wide_params == 2 * 4 * width * width * layers + 4 * width * layers + width
    # Counted once in the model.
    others = sum(
        l.count_params() for l in model.layers if l is not shared and not isinstance(l, keras.layers.InputLayer)
    )
    assert model.count_params() == wide_params + others
    path = str(tmp_path / "wide.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    xs = tf.random.stateless_normal([2, 5, width], seed=[3, 4])
    np.testing.assert_allclose(model(xs), restored(xs), rtol=1e-6, atol=1e-6)
    assert restored.count_params() == model.count_params()
    restored.get_layer("wide").inner.kernel.assign(tf.zeros_like(restored.get_layer("wide").inner.kernel))
    assert not np.allclose(restored(xs), model(xs))  # one kernel drives every block


def test_config_round_trips_and_errors():
    block = SimplifiedBlock(
        4,
        variant="sequential",
        intermediate_dim=5,
        feedforward=False,
        value_projection=True,
        attention_gain=0.5,
        feedforward_gain=0.2,
        layer_norm_epsilon=1e-3,
        max_length=9,
    )
    assert SimplifiedBlock.from_config(block.get_config()).get_config() == block.get_config()
    wide = WideFeedForward(width=33, num_layers=2, activation="gelu", kernel_initializer="he_normal")
    assert WideFeedForward.from_config(wide.get_config()).get_config() == wide.get_config()
    with pytest.raises(ValueError, match="variant='skip'"):
        SimplifiedBlock(2, variant="skip")
    with pytest.raises(ValueError, match="num_layers=0"):
        WideFeedForward(num_layers=0)
    with pytest.raises(TypeError, match="float inputs"):
        WideFeedForward()(tf.zeros([1, 2, 3], tf.int32))


def test_shared_wide_feedforward_stays_shared_in_a_saved_model(tmp_path):
    shared = WideFeedForward(num_layers=2, name="wide")
    inputs = keras.Input((None, WIDTH))
    x = inputs
    for i in range(2):
        x = SimplifiedBlock(2, feedforward=False, name=f"block_{i}")(x) + shared(x)
    model = keras.Model(inputs, x)
    path = str(tmp_path / "saved")
    model.export(path)
    loaded = tf.saved_model.load(path)
    wide = [v for v in loaded.variables if "wide" in v.name]
    assert len(wide) == 4  # one kernel and bias per dense layer, not one set per block
    xs = tf.random.stateless_normal([2, 5, WIDTH], seed=[7, 8])
    np.testing.assert_allclose(loaded.serve(xs), model(xs), rtol=1e-5, atol=1e-5)
