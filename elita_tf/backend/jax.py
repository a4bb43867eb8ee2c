"""The JAX side of `elita_tf.backend`: everything is compiled by XLA, so no branch on data."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
from keras.ops import custom_gradient, full  # noqa: F401  (Keras' own, as `elita_tf.backend` takes them)


def compiled_or_on_gpu():
    return True


def branch_or_select(usual, fast, general):
    return general()


def cumulative_logsumexp(x, axis, reverse=False):
    return jax.lax.cumlogsumexp(x, axis=axis % x.ndim, reverse=reverse)


def ordered(after, compute):
    return compute()


def unlinked(outputs):
    """The outputs as they are: a gradient function that keeps one holds no cycle here."""
    return outputs


def matmul(a, b, transpose_a=False, transpose_b=False):
    return jnp.matmul(jnp.swapaxes(a, -1, -2) if transpose_a else a, jnp.swapaxes(b, -1, -2) if transpose_b else b)


def maximum(a, b):
    return jnp.maximum(a, b)


def minimum(a, b):
    return jnp.minimum(a, b)


def check_less_equal(x, limit, message):
    """Raises where the values are known (eagerly); under `jit` there is nothing to raise from."""
    if not isinstance(x, jax.core.Tracer) and not isinstance(limit, jax.core.Tracer):
        if not np.all(np.asarray(x) <= np.asarray(limit)):
            raise ValueError(f"{message}. Received: {np.asarray(x)} > {np.asarray(limit)}")


def check_all(condition, message, report):
    """Traced (`jit`, `torch.compile`, Keras' symbolic build) there is nothing to raise from: the caller checks known
    values itself."""
    return None


def cumsum(x, axis, exclusive=False):
    total = jax.numpy.cumsum(x, axis=axis)
    if not exclusive:
        return total
    axis = axis % x.ndim
    pads = [(0, 0, 0)] * x.ndim
    pads[axis] = (1, -1, 0)  # one zero in front, the last sum dropped
    return jax.lax.pad(total, jax.numpy.zeros((), total.dtype), pads)


def scan(step, init, xs):
    return jax.lax.scan(step, init, xs)


def segment_sum(data, segment_ids, num_segments):
    return jax.ops.segment_sum(data, segment_ids, num_segments)


def no_gradient():
    return contextlib.nullcontext()
