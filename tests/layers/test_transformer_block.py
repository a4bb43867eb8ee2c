import numpy as np
import keras
import pytest
import tensorflow as tf

from elita_tf.layers import TransformerBlock
from tests.layers.reference_check import assert_matches_reference

WIDTH = 8


def _block(dtype="float32", **kwargs):
    block = TransformerBlock(**{"num_heads": 2, "max_length": 300, **kwargs}, dtype=dtype)
    block.build((None, None, WIDTH))
    rng = np.random.default_rng(0)
    for var in block.weights:
        var.assign(rng.normal(size=var.shape) * 0.4 + (1.0 if var.path.endswith("gamma") else 0.0))
    return block


def reference(block, x, mask=None):
    """Pre-norm block by its definition, in float64, from the block's own weights."""
    w = lambda v: tf.cast(tf.convert_to_tensor(v), tf.float64)  # noqa: E731
    x = tf.cast(x, tf.float64)

    def norm(t, layer):
        mean, var = tf.nn.moments(t, axes=[-1], keepdims=True)
        return (t - mean) / tf.sqrt(var + layer.epsilon) * w(layer.gamma) + w(layer.beta)

    def dense(t, layer, equation):
        return tf.einsum(equation, t, w(layer.kernel)) + w(layer.bias)

    att = block.attention
    xn = norm(x, block.attention_norm)
    q, k, v = (dense(xn, d, "btd,dhe->bthe") for d in (att.query_dense, att.key_dense, att.value_dense))
    length = x.shape[1]
    visible = np.tril(np.ones((length, length), bool))[None, None]
    if mask is not None:
        visible = visible & np.asarray(mask, bool)[:, None, None, :]
    scores = tf.einsum("bthe,bshe->bhts", q, k) / np.sqrt(q.shape[-1])
    weights = tf.nn.softmax(tf.where(visible, scores, -1e300), axis=-1)
    h = x + dense(tf.einsum("bhts,bshe->bthe", weights, v), att.output_dense, "bthe,hed->btd")
    inner = tf.nn.gelu(dense(norm(h, block.ffn_norm), block.ffn_inner, "btd,df->btf"), approximate=False)
    return h + dense(inner, block.ffn_output, "btf,fd->btd")


@pytest.mark.parametrize("length", [1, 63, 100, 257])
def test_outputs_and_gradients_match_reference(length):
    block = _block("float64")
    x = tf.constant(np.random.default_rng(1).normal(size=(2, length, WIDTH)))
    assert_matches_reference(block, lambda x: reference(block, x), x, block.weights, rtol=1e-8, atol=1e-8)


def test_causality_padding_and_decoding():
    block = _block()
    x = tf.random.stateless_normal([2, 60, WIDTH], seed=[1, 2])
    full = block(x)
    np.testing.assert_array_equal(block(tf.concat([x[:, :31], -x[:, 31:]], 1))[:, :31], full[:, :31])

    mask = np.ones((2, 60), bool)
    mask[0, 3:8] = False
    masked = block(x, padding_mask=mask)
    np.testing.assert_allclose(masked.numpy()[mask], reference(block, x, mask).numpy()[mask], rtol=1e-4, atol=1e-4)

    cache = block.get_initial_cache(2)
    outs = []
    for start, stop in [(0, 35), (35, 45)] + [(t, t + 1) for t in range(45, 60)]:
        y, cache = block(x[:, start:stop], padding_mask=mask[:, start:stop], cache=cache)
        outs.append(y)
    decoded = tf.concat(outs, 1).numpy()
    np.testing.assert_allclose(decoded[mask], masked.numpy()[mask], rtol=1e-4, atol=1e-4)
    assert int(cache[3]) == 60 and cache[0].shape == (2, 300, 2, 4)


def test_config_and_keras_save(tmp_path):
    block = TransformerBlock(4, head_dim=3, intermediate_dim=20, dropout=0.1, layer_norm_epsilon=1e-3, max_length=99)
    config = block.get_config()
    assert TransformerBlock.from_config(config).get_config() == config
    inputs = keras.Input((None, WIDTH))
    model = keras.Model(inputs, block(inputs))
    path = str(tmp_path / "block.keras")
    model.save(path)
    x = tf.random.stateless_normal([2, 7, WIDTH], seed=[3, 4])
    np.testing.assert_array_equal(model(x), keras.models.load_model(path)(x))


@pytest.mark.parametrize("name", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(policy, name):
    policy(name)
    block = TransformerBlock(2)
    y = block(tf.random.stateless_normal([1, 1024, 16], seed=[5, 6]))
    assert y.dtype == block.compute_dtype and all(w.dtype == "float32" for w in block.weights)
    assert np.all(np.isfinite(tf.cast(y, tf.float32)))


def test_bad_inputs():
    with pytest.raises(ValueError, match="num_heads=0"):
        TransformerBlock(0)
    with pytest.raises(ValueError, match="dropout=1.5"):
        TransformerBlock(2, dropout=1.5)
    with pytest.raises(TypeError, match="float inputs"):
        TransformerBlock(2)(tf.zeros([1, 3, 4], tf.int32))
    block = TransformerBlock(2)
    assert block(tf.zeros([1, 0, 4])).shape == (1, 0, 4)
    with pytest.raises(ValueError, match="axis -1"):
        block(tf.zeros([1, 3, 5]))


def test_cache_overflow_is_an_error():
    block = TransformerBlock(2, max_length=4)
    with pytest.raises(ValueError, match="build or call it"):
        block.get_initial_cache(1)
    block.build((None, None, WIDTH))
    cache = block.get_initial_cache(1)
    _, cache = block(tf.zeros([1, 3, WIDTH]), cache=cache)
    with pytest.raises(tf.errors.InvalidArgumentError, match="is full"):
        block(tf.zeros([1, 2, WIDTH]), cache=cache)
