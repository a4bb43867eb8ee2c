import keras
import numpy as np
import pytest
from keras import ops

from elita_tf.layers import FeedForward2
from elita_tf.ops.pairwise_projection import pairwise_product
from tests.backend_utils import compiled, numpy, random_normal, tensor
from tests.layers.keras_float64 import DENSE, float64_tolerance
from tests.layers.reference_check import assert_matches_reference


def _layer(dtype="float32", **kwargs):
    layer = FeedForward2(dtype=dtype, **kwargs)
    layer.build((None, None, 6))
    rng = np.random.default_rng(0)
    for var in layer.weights:
        var.assign(rng.normal(size=var.shape) * 0.5)
    return layer


def reference(layer, x):
    """The definition (docs/math.md §3) literally: einsum('bti,btj,ijw->btw') of the two swish branches."""
    w = {n: ops.cast(getattr(layer, n).value, "float64") for n in ["w1", "b1", "w2", "b2", "w3", "b3"]}
    x = ops.cast(x, "float64")
    swish = lambda z: z * ops.sigmoid(z)  # noqa: E731
    alpha = swish(ops.einsum("btd,da->bta", x, w["w1"]) + w["b1"])
    beta = swish(ops.einsum("btd,dk->btk", x, w["w2"]) + w["b2"])
    return ops.einsum("bti,btj,ijw->btw", alpha, beta, w["w3"]) + w["b3"]


@pytest.mark.parametrize("length", [1, 63, 100, 257])
def test_forward_and_gradients_match_reference(length):
    layer = _layer("float64", intermediate_dim=5, factor=3)
    x = tensor(np.random.default_rng(1).normal(size=(2, length, 6)))
    tol = float64_tolerance(1e-10, DENSE)
    assert_matches_reference(layer, lambda x: reference(layer, x), x, layer.weights, rtol=tol, atol=tol)
    layer32 = _layer(intermediate_dim=5, factor=3)
    np.testing.assert_allclose(
        numpy(layer32(ops.cast(x, "float32"))), numpy(reference(layer32, x)), rtol=1e-5, atol=1e-5
    )


def test_lora_trains_through_the_fused_projection():
    """With LoRA on `w3`, outputs and gradients (to the LoRA factors, not the frozen kernel) are the Einsum layer's."""
    layer = _layer("float64", intermediate_dim=5, factor=3)
    layer.w3_dense.enable_lora(2)
    layer.w3_dense.lora_kernel_b.assign(np.random.default_rng(2).normal(size=layer.w3_dense.lora_kernel_b.shape))
    assert "lora_kernel_a" in {w.path.rsplit("/", 1)[-1] for w in layer.trainable_weights}
    x = tensor(np.random.default_rng(3).normal(size=(2, 7, 6)))

    def einsum_layer(x):
        flat = ops.reshape(x, (-1, 6))
        alpha, beta = ops.silu(layer.w1_dense(flat)), ops.silu(layer.w2_dense(flat))  # the branches' swish
        outputs = layer.w3_dense(pairwise_product(alpha, beta))
        return ops.reshape(outputs, ops.shape(x))

    tol = float64_tolerance(1e-10, DENSE)
    assert_matches_reference(layer, einsum_layer, x, layer.trainable_weights, rtol=tol, atol=tol)


def test_int8_quantized_layer_runs_the_einsum_layer():
    layer = _layer(intermediate_dim=5, factor=3)
    x = random_normal((2, 7, 6), seed=4)
    before = numpy(layer(x))
    inputs = keras.Input((None, 6))
    keras.Model(inputs, layer(inputs)).quantize("int8")  # Keras quantizes the Dense/EinsumDense sublayers
    assert layer.w3_dense.quantization_mode == "int8"
    after = numpy(layer(x))
    assert after.shape == before.shape and np.all(np.isfinite(after))
    np.testing.assert_allclose(after, before, rtol=0.1, atol=0.1 * np.abs(before).max())


def test_weights_and_parameter_count():
    layer = FeedForward2()
    layer.build((None, None, 16))
    shapes = {name: tuple(getattr(layer, name).shape) for name in ["w1", "b1", "w2", "b2", "w3", "b3"]}
    assert shapes == {"w1": (16, 16), "b1": (16,), "w2": (16, 8), "b2": (8,), "w3": (16, 8, 16), "b3": (16,)}
    # Dense / EinsumDense sublayers, named after the documented weights.
    assert sorted("/".join(w.path.split("/")[-2:]) for w in layer.weights) == sorted(
        ["w1/kernel", "w1/bias", "w2/kernel", "w2/bias", "w3/kernel", "w3/bias"]
    )
    d = 16
    assert layer.count_params() == 9 * d * d + 10 * d + 8
    assert np.all(numpy(layer.b3) == 0)


def test_position_wise():
    layer = _layer()
    x = random_normal((2, 9, 6), seed=0)
    np.testing.assert_allclose(numpy(layer(x[:, 4:5])), numpy(layer(x))[:, 4:5], rtol=1e-6, atol=1e-6)
    assert tuple(layer(ops.zeros((2, 0, 6))).shape) == (2, 0, 6)


def test_compiled_matches_eager():
    layer = _layer(intermediate_dim=5, factor=3)
    x = random_normal((2, 33, 6), seed=5)
    np.testing.assert_allclose(numpy(compiled(layer)(x)), numpy(layer(x)), rtol=1e-5, atol=1e-5)


def test_config_round_trip_and_keras_save(tmp_path):
    layer = FeedForward2(
        intermediate_dim=7, factor=3, kernel_initializer="he_uniform", bias_initializer="ones", name="ff"
    )
    config = layer.get_config()
    assert FeedForward2.from_config(config).get_config() == config
    inputs = keras.Input((None, 6))
    model = keras.Model(inputs, layer(inputs))
    path = str(tmp_path / "ff.keras")
    model.save(path)
    x = random_normal((2, 5, 6), seed=3)
    np.testing.assert_array_equal(numpy(model(x)), numpy(keras.models.load_model(path)(x)))


@pytest.mark.parametrize("name", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(policy, name):
    policy(name)
    layer = FeedForward2()
    y = layer(random_normal((2, 4096, 16), seed=6))
    assert keras.backend.standardize_dtype(y.dtype) == layer.compute_dtype
    assert all(w.dtype == "float32" for w in layer.weights)
    assert np.all(np.isfinite(numpy(y)))


def test_bad_inputs():
    with pytest.raises(ValueError, match="factor=0"):
        FeedForward2(factor=0)
    with pytest.raises(ValueError, match="intermediate_dim=-1"):
        FeedForward2(intermediate_dim=-1)
    layer = FeedForward2()
    with pytest.raises(ValueError, match="ndim=3"):
        layer(ops.zeros((3, 4)))
    layer(ops.zeros((1, 2, 4)))
    with pytest.raises(ValueError, match="axis -1"):
        layer(ops.zeros((1, 2, 5)))
    with pytest.raises(TypeError, match="float inputs"):
        FeedForward2()(ops.zeros((1, 2, 4), "int32"))
