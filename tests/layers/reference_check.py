"""The fla rule for layers: outputs and gradients against a naive reference, on every backend."""

import keras
import numpy as np
from keras import ops

from tests.backend_utils import numpy, outputs_and_gradients


def assert_matches_reference(layer, reference, x, variables, rtol, atol, seed=2):
    """`layer(x)` and `reference(x)` agree: outputs, and gradients of a random projection
    of the outputs with respect to `x` and every variable; everything finite.

    Args:
        layer: the layer (float64 for tight tolerances).
        reference: callable `x -> outputs`, the naive form built from the layer's weights
            (reading each variable's `.value`, so that its gradient is taken on every backend).
        x: float inputs.
        variables: the layer's Keras variables whose gradients are compared.
    """
    x = ops.convert_to_tensor(x)
    cotangent = np.random.default_rng(seed).normal(size=x.shape)
    names = ["outputs", "inputs"] + [v.path for v in variables]
    (got,), got_grads = outputs_and_gradients(layer, [x], [cotangent], variables)
    (want,), want_grads = outputs_and_gradients(reference, [x], [cotangent], variables)
    for name, g, w in zip(names, [got, *got_grads], [want, *want_grads]):
        assert np.all(np.isfinite(g)), name
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)


def assert_mixed_precision_finite(layer, x):
    """Under a mixed policy: outputs in the compute dtype, variables float32, outputs and
    gradients of a mean-square loss finite."""
    x = ops.convert_to_tensor(x)
    y = layer(x)
    assert keras.backend.standardize_dtype(y.dtype) == layer.compute_dtype != "float32"
    assert all(w.dtype == "float32" for w in layer.weights)
    # The gradient of the mean square, `2 y / N`: unscaled, the float16 gradients of a long input would overflow.
    cotangent = 2.0 * np.asarray(numpy(y), np.float32) / np.prod(y.shape)
    (out,), grads = outputs_and_gradients(layer, [x], [cotangent], layer.trainable_weights)
    assert np.all(np.isfinite(out))
    assert all(np.all(np.isfinite(g)) for g in grads)
