import numpy as np
import pytest
from keras import ops

from elita_tf.layers import DecoderBlock, LinearAttention, ShortConvolution
from elita_tf.ops.reference import short_convolution_reference
from tests.backend_utils import numpy, tensor
from tests.layers.reference_check import assert_matches_reference
from tests.ops.documents import random_document_starts

WIDTH = 6


def _layer():
    """A float64 layer with a bias, its weights drawn around zero (the bias starts at zero)."""
    layer = ShortConvolution(kernel_size=4, use_bias=True, dtype="float64")
    layer.build((None, None, WIDTH))
    rng = np.random.default_rng(0)
    layer.kernel.assign(rng.normal(size=layer.kernel.shape) * 0.5)
    layer.bias.assign(rng.normal(size=layer.bias.shape) * 0.5)
    return layer


def reference(layer, x, document_starts=None):
    """The `[T, T]` definition of each channel's convolution, then SiLU, in float64."""
    kernel, bias = (ops.cast(v.value, "float64") for v in (layer.kernel, layer.bias))
    return ops.silu(short_convolution_reference(ops.cast(x, "float64"), kernel, bias, document_starts=document_starts))


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("length", [1, 63, 100, 257])
def test_outputs_and_gradients_match_reference(length, packed):
    layer = _layer()
    x = tensor(np.random.default_rng(1).normal(size=(2, length, WIDTH)))
    starts = tensor(random_document_starts(2, length)) if packed else None
    assert_matches_reference(
        lambda x: layer(x, document_starts=starts),
        lambda x: reference(layer, x, starts),
        x,
        layer.weights,
        rtol=1e-10,
        atol=1e-10,
    )


def test_the_default_kernel_is_pytorchs_depthwise_initialization():
    layer = ShortConvolution()  # K = 4, no bias, SiLU: flash-linear-attention's defaults
    layer.build((None, None, 512))
    kernel = numpy(layer.kernel)
    assert kernel.shape == (4, 512) and len(layer.weights) == 1
    assert 0.45 < np.abs(kernel).max() <= 0.5 and abs(kernel.std() - 0.5 / np.sqrt(3)) < 0.01  # U(±1 / sqrt(4))


def test_bad_arguments_and_inputs():
    with pytest.raises(ValueError, match="kernel_size=0"):
        ShortConvolution(0)
    with pytest.raises(ValueError, match="^`activation` must be a Keras activation.* Received: activation='no-such-activation'$"):
        ShortConvolution(activation="no-such-activation")
    with pytest.raises(TypeError, match="float inputs"):
        ShortConvolution()(tensor(np.zeros([1, 3, 4], "int32")))
    with pytest.raises(TypeError, match=r"`short_convolution` must be a ShortConvolution layer or None. Received: "):
        DecoderBlock(LinearAttention(1, 4), short_convolution=4)
    layer = ShortConvolution()
    with pytest.raises(ValueError, match="build or call it before `get_initial_cache`"):
        layer.get_initial_cache(2)
    assert tuple(layer(tensor(np.zeros([1, 0, 4], "float32"))).shape) == (1, 0, 4)
