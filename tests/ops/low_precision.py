"""Mixed precision checked by value: an op on 16-bit inputs against the same op on those inputs in float32."""

import numpy as np
import tensorflow as tf

# Machine epsilon of each 16-bit dtype: the unit these tolerances are counted in.
EPSILON = {tf.float16: 2.0**-10, tf.bfloat16: 2.0**-7}


def assert_low_precision_follows_float32(op, inputs, dtype, output_tolerance=1e-4):
    """`op` on `inputs` cast to `dtype` equals `op` on the same (rounded) values in float32.

    The op accumulates in float32 whatever its inputs' dtype, so its float outputs equal the
    float32 run's to float32 round-off (`output_tolerance`, relative to each output's largest
    value), and the gradient of each input is the float32 gradient rounded once to `dtype`: within
    one epsilon of it. A gradient lost on the 16-bit path (zero, or cut by a `stop_gradient`) fails.

    Args:
        op: callable on the inputs, returning a tensor or a nest of tensors.
        inputs: float tensors.
        dtype: `tf.float16` or `tf.bfloat16`.
    """
    low = [tf.cast(x, dtype) for x in inputs]
    rounded = [tf.cast(x, tf.float32) for x in low]

    def run(args):
        with tf.GradientTape() as tape:
            tape.watch(args)
            outputs = [o for o in tf.nest.flatten(op(*args)) if o.dtype.is_floating]
            rng = np.random.default_rng(3)
            loss = sum(tf.reduce_sum(tf.cast(o, tf.float32) * rng.normal(size=o.shape)) for o in outputs)
        return outputs, tape.gradient(loss, args)

    (got, got_grads), (want, want_grads) = run(low), run(rounded)
    for g, w in zip(got, want):
        assert g.dtype == tf.float32, f"an output in {g.dtype.name}: the op does not accumulate in float32"
        scale = max(np.abs(w.numpy()).max(), 1e-30)
        np.testing.assert_allclose(g, w, rtol=output_tolerance, atol=output_tolerance * scale)
    for g, w in zip(got_grads, want_grads):
        assert g is not None and g.dtype == dtype
        w = w.numpy()
        np.testing.assert_allclose(
            tf.cast(g, tf.float32), w, rtol=EPSILON[dtype], atol=EPSILON[dtype] * np.abs(w).max()
        )
