"""Mixed precision checked by value: an op on 16-bit inputs against the same op on those inputs in float32."""

import keras
import numpy as np
from keras import ops

from tests.backend_utils import outputs_and_gradients

# Machine epsilon of each 16-bit dtype: the unit these tolerances are counted in.
EPSILON = {"float16": 2.0**-10, "bfloat16": 2.0**-7}


def assert_low_precision_follows_float32(op, inputs, dtype, output_tolerance=1e-4):
    """`op` on `inputs` cast to `dtype` equals `op` on the same (rounded) values in float32.

    The op accumulates in float32 whatever its inputs' dtype, so its float outputs equal the
    float32 run's to float32 round-off (`output_tolerance`, relative to each output's largest
    value), and the gradient of each input is the float32 gradient rounded once to `dtype`: within
    one epsilon of it. A gradient lost on the 16-bit path (zero, or cut by a `stop_gradient`) fails.

    Args:
        op: callable on the inputs, returning a tensor or a nest of tensors.
        inputs: float tensors or arrays.
        dtype: `"float16"` or `"bfloat16"`.
    """
    name = keras.backend.standardize_dtype(dtype)
    low = [ops.cast(x, dtype) for x in inputs]
    rounded = [ops.cast(x, "float32") for x in low]

    def float_outputs(*args):
        return tuple(o for o in keras.tree.flatten(op(*args)) if "float" in keras.backend.standardize_dtype(o.dtype))

    rng = np.random.default_rng(3)
    cotangents = [rng.normal(size=o.shape).astype(np.float32) for o in float_outputs(*rounded)]
    (got, got_grads), (want, want_grads) = (
        outputs_and_gradients(float_outputs, args, cotangents) for args in (low, rounded)
    )
    for raw in float_outputs(*low):
        assert keras.backend.standardize_dtype(raw.dtype) == "float32", (
            f"an output in {raw.dtype}: the op does not accumulate in float32"
        )
    for g, w in zip(got, want):
        scale = max(np.abs(w).max(), 1e-30)
        np.testing.assert_allclose(g, w, rtol=output_tolerance, atol=output_tolerance * scale)
    # The gradients come back in their inputs' 16-bit dtype (`numpy` widens them to float32 for the check).
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=EPSILON[name], atol=EPSILON[name] * np.abs(w).max())
