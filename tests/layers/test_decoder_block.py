import keras
import numpy as np
import pytest
from keras import ops

from elita_tf.layers import (
    Attention2,
    DecoderBlock,
    FeedForward,
    FeedForward2,
    OuterEpsilonRMSNormalization,
    ShapedAttention,
    UnscaledLayerNormalization,
)
from tests.backend_utils import compiled, numpy, random_normal, tensor
from tests.layers.keras_float64 import DENSE, NORMS, float64_tolerance

WIDTH = 8


def _float64(x):
    return ops.cast(x.value, "float64")


def _rms(x, layer):
    # `ops.sum / n`, not `ops.mean`: Keras' mean reduces float64 in float32 on JAX and PyTorch.
    return x * ops.rsqrt(ops.sum(x**2, -1, keepdims=True) / x.shape[-1] + layer.epsilon) * _float64(layer.scale)


def _layer_norm(x, layer):
    mean, var = ops.moments(x, axes=[-1], keepdims=True)
    normed = (x - mean) / ops.sqrt(var + layer.epsilon)
    return normed if not getattr(layer, "scale", False) else normed * _float64(layer.gamma) + _float64(layer.beta)


def _randomised(block):
    block.build((None, None, WIDTH))
    rng = np.random.default_rng(0)
    for var in block.weights:
        var.assign(rng.normal(size=var.shape) * 0.5 + 1.0)
    return block


@pytest.mark.parametrize("residual", ["pre_norm", "parallel", "sequential"])
@pytest.mark.parametrize("norm", ["layer_norm", "unscaled_layer_norm", "rms_norm", None])
def test_block_equations(residual, norm):
    mixer, ffn = ShapedAttention(2, dtype="float64"), FeedForward(use_bias=False, dtype="float64")
    block = _randomised(DecoderBlock(mixer, ffn, norm=norm, residual=residual, dtype="float64"))
    x = tensor(np.random.default_rng(1).normal(size=(2, 37, WIDTH)))
    n = {
        "layer_norm": _layer_norm,
        "unscaled_layer_norm": _layer_norm,
        "rms_norm": _rms,
        None: lambda x, layer: x,
    }[norm]
    mlp = lambda t: ops.relu(t @ _float64(ffn.inner.kernel)) @ _float64(ffn.outer.kernel)  # noqa: E731
    xn = n(x, block.mixer_norm)
    if residual == "pre_norm":
        h = x + mixer(xn)
        want = h + mlp(n(h, block.ffn_norm))
    elif residual == "parallel":
        want = _float64(block.mixer_scale) * mixer(xn) + _float64(block.ffn_scale) * mlp(xn)
    else:
        h = _float64(block.mixer_scale) * mixer(xn)
        want = h + _float64(block.ffn_scale) * mlp(n(h, block.ffn_norm))
    # FeedForward is two Dense layers; layer_norm and rms_norm are Keras' own.
    # Outputs of a few hundred, through two norms and two branches: a few float32 ulps of that.
    tol = float64_tolerance(1e-10, DENSE, NORMS if norm in ("layer_norm", "rms_norm") else (), float32=1e-4)
    np.testing.assert_allclose(numpy(block(x)), numpy(want), rtol=tol, atol=tol)


def test_gains_start_at_their_settings_and_a_block_without_ffn_is_its_mixer_branch():
    block = DecoderBlock(ShapedAttention(2), FeedForward(), norm="rms_norm", residual="parallel")
    block.build((None, None, WIDTH))
    assert float(block.mixer_scale) == 1.0 and float(block.ffn_scale) == pytest.approx(0.1)
    assert not hasattr(DecoderBlock(ShapedAttention(2)), "mixer_scale")  # pre-norm has no gains
    lone = _randomised(DecoderBlock(Attention2(2, 4, 2), norm=None))
    x = random_normal((2, 9, WIDTH), seed=1)
    np.testing.assert_allclose(numpy(lone(x)), numpy(x + lone.mixer(x)), rtol=1e-6)


def _shared_model(layers=3):
    shared = FeedForward(shared_by=layers, name="wide")
    inputs = keras.Input((None, WIDTH))
    x = inputs
    for i in range(layers):
        x = DecoderBlock(ShapedAttention(2), shared, norm="rms_norm", residual="parallel", name=f"block_{i}")(x)
    return keras.Model(inputs, x), shared


def test_a_shared_ffn_stays_shared_after_save(tmp_path):
    model, shared = _shared_model()
    assert shared.inner.kernel.shape == (WIDTH, 4 * WIDTH * 3)
    wide_params = 2 * 4 * WIDTH * WIDTH * 3 + 4 * WIDTH * 3 + WIDTH
    assert shared.count_params() == wide_params
    per_block = sum(int(np.prod(w.shape)) for w in model.get_layer("block_0").weights) - wide_params
    assert model.count_params() == wide_params + 3 * per_block  # counted once
    path = str(tmp_path / "wide.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    xs = random_normal((2, 5, WIDTH), seed=3)
    np.testing.assert_allclose(numpy(model(xs)), numpy(restored(xs)), rtol=1e-6, atol=1e-6)
    assert restored.count_params() == model.count_params()
    assert restored.get_layer("block_0").ffn is restored.get_layer("block_2").ffn
    kernel = restored.get_layer("block_1").ffn.inner.kernel
    kernel.assign(np.zeros(kernel.shape))
    assert not np.allclose(numpy(restored(xs)), numpy(model(xs)))  # one kernel drives every block


@pytest.mark.tf_only
def test_a_shared_ffn_stays_shared_in_a_saved_model(tmp_path):
    import tensorflow as tf

    model, _ = _shared_model(2)
    path = str(tmp_path / "saved")
    model.export(path)
    loaded = tf.saved_model.load(path)
    wide = [v for v in loaded.variables if "wide" in v.name]
    assert len(wide) == 4  # one kernel and bias per dense layer, not one set per block
    xs = tf.random.stateless_normal([2, 5, WIDTH], seed=[7, 8])
    np.testing.assert_allclose(loaded.serve(xs), model(xs), rtol=1e-5, atol=1e-5)


def test_bad_arguments_name_the_value():
    with pytest.raises(TypeError, match="CausalMixer.*Received: mixer="):
        DecoderBlock(FeedForward2())
    with pytest.raises(TypeError, match="Received: ffn='mlp'"):
        DecoderBlock(ShapedAttention(2), "mlp")
    with pytest.raises(ValueError, match="residual='skip'"):
        DecoderBlock(ShapedAttention(2), residual="skip")
    with pytest.raises(ValueError, match="norm='batch_norm'"):
        DecoderBlock(ShapedAttention(2), norm="batch_norm")
    with pytest.raises(ValueError, match="dropout=1.0"):
        DecoderBlock(ShapedAttention(2), dropout=1.0)
    wide = FeedForward(
        intermediate_dim=33, shared_by=2, activation="gelu", use_bias=False, kernel_initializer="he_normal"
    )
    assert FeedForward.from_config(wide.get_config()).get_config() == wide.get_config()


def test_compiled_matches_eager_and_decoding():
    block = _randomised(DecoderBlock(ShapedAttention(2, max_sequence_length=64), FeedForward2(), residual="sequential"))
    x = random_normal((2, 21, WIDTH), seed=9, scale=0.5)
    mask = np.ones((2, 21), bool)
    mask[1, 2:5] = False
    want = numpy(block(x, padding_mask=tensor(mask)))
    got = numpy(compiled(lambda x, m: block(x, padding_mask=m))(x, tensor(mask)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    cache, outputs = block.get_initial_cache(2), []
    for start, stop in [(0, 12), (12, 15)] + [(t, t + 1) for t in range(15, 21)]:
        y, cache = block(x[:, start:stop], padding_mask=tensor(mask[:, start:stop]), cache=cache)
        outputs.append(numpy(y))
    np.testing.assert_allclose(np.concatenate(outputs, 1)[mask], want[mask], rtol=1e-4, atol=1e-4)


def test_outer_epsilon_rms_norm_matches_its_definition():
    layer = _randomised(OuterEpsilonRMSNormalization(epsilon=0.1, dtype="float64"))
    x = np.random.default_rng(2).normal(size=(2, 5, WIDTH))
    rms = np.sqrt(np.mean(x**2, -1, keepdims=True))
    want = numpy(layer.scale) * x / (rms + 0.1)  # the epsilon outside the root
    np.testing.assert_allclose(numpy(layer(tensor(x))), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "make",
    [
        lambda: OuterEpsilonRMSNormalization(epsilon=1e-4),
        lambda: UnscaledLayerNormalization(epsilon=1e-4),
        lambda: FeedForward(intermediate_dim=12, activation="gelu"),
    ],
)
def test_block_parts_compiled_and_saved(make, tmp_path):
    layer = _randomised(make())
    x = random_normal((2, 9, WIDTH), seed=4)
    want = numpy(layer(x))
    np.testing.assert_allclose(numpy(compiled(layer)(x)), want, rtol=1e-5, atol=1e-5)
    inputs = keras.Input((None, WIDTH))
    model = keras.Model(inputs, layer(inputs))
    path = str(tmp_path / "part.keras")
    model.save(path)
    np.testing.assert_array_equal(numpy(keras.models.load_model(path)(x)), numpy(model(x)))


@pytest.mark.skipif(ops.convert_to_tensor(0).__class__.__module__ != "torch", reason="PyTorch's allocations")
def test_an_elita_block_holds_seven_of_its_inputs_for_the_backward_pass(tmp_path):
    # What a training forward leaves allocated for the backward pass, in [B, T, d] tensors: the two norms' outputs,
    # the values and the causal means, FeedForward2's pre-activations (9/8 of one) and the kernel's smaller factors,
    # 7.1 in all. It held 11.1 while Keras' PyTorch custom_gradient saved every input (a norm's is the residual
    # stream), the mixer got a copy of its input, the values were copied to zero padding there is none of, and the
    # kernel's chunk sums were kept whole for their last rows.
    import json

    import torch
    from torch.profiler import ProfilerActivity, profile

    width, batch, length = 64, 2, 256
    block = DecoderBlock(Attention2(4, 16, 8, position_scale=length), FeedForward2(), norm="unscaled_layer_norm")
    block.build((None, None, width))
    leaf = torch.randn(batch, length, width, requires_grad=True)
    inputs = leaf * 1.0  # an input with a graph of its own, as the residual stream has
    padding_mask = torch.ones(batch, length, dtype=torch.bool)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        outputs = block(inputs, padding_mask=padding_mask, training=True)
    profiler.export_chrome_trace(str(tmp_path / "trace.json"))
    live = {}  # what the forward pass allocated and did not free
    for event in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]:
        if event.get("name") == "[memory]":
            size, address = event["args"]["Bytes"], event["args"]["Addr"]
            if size > 0:
                live[address] = size
            else:
                live.pop(address, None)
    held = sum(live.values()) - outputs.numel() * outputs.element_size()
    one = batch * length * width * 4
    assert held <= 8 * one, held / one
    outputs.sum().backward()
    assert bool(torch.isfinite(leaf.grad).all())
