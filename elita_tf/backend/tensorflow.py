"""The TensorFlow side of `elita_tf.backend`."""

import contextlib

import tensorflow as tf
from keras.ops import custom_gradient, full  # noqa: F401  (Keras' own, as `elita_tf.backend` takes them)

from elita_tf.private_apis import in_xla_context


def compiled_or_on_gpu():
    """Whether the graph being traced is compiled by XLA, or a GPU is visible to TensorFlow."""
    return in_xla_context(tf.compat.v1.get_default_graph()) or bool(tf.config.list_logical_devices("GPU"))


def branch_or_select(usual, fast, general):
    """On a CPU without XLA a `tf.cond`: the general form, an extra pass, runs only when needed. Traced for
    XLA or with a GPU visible, `general()` alone: a branch copies its predicate to the host, and under XLA ends
    the GPU's command buffer there, which costs more than the extra pass that XLA fuses into its neighbours."""
    if compiled_or_on_gpu():
        return general()
    return tf.cond(usual, fast, general)


def cumulative_logsumexp(x, axis, reverse=False):
    return tf.math.cumulative_logsumexp(x, axis=axis, reverse=reverse)


def ordered(after, compute):
    with tf.control_dependencies(tf.nest.flatten(after)):
        return compute()


def check_less_equal(x, limit, message):
    """Returns the check for `ordered` (None eagerly, where control dependencies are ignored): in a graph, an op
    that reads nothing from it may run before it."""
    return tf.debugging.assert_less_equal(x, limit, message=message)


def check_all(condition, message, report):
    """In a graph, an assertion that fails the step with `message` and the tensors `report()` gives (computed only
    when it fails) unless `condition` holds everywhere; XLA drops it. Returns the check, for `ordered`."""

    def fail():
        with tf.control_dependencies([tf.debugging.Assert(False, [message, *report()], summarize=12)]):
            return tf.constant(False)

    return tf.cond(tf.reduce_all(condition), lambda: tf.constant(True), fail)


def matmul(a, b, transpose_a=False, transpose_b=False):
    return tf.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)


def maximum(a, b):
    return tf.maximum(a, b)


def minimum(a, b):
    return tf.minimum(a, b)


def cumsum(x, axis, exclusive=False):
    return tf.cumsum(x, axis=axis, exclusive=exclusive)


def scan(step, init, xs):
    """A `tf.while_loop` with one step in flight, so that one step's intermediates exist at a time. Keras'
    own TensorFlow `scan` wants each `y` shaped like the carry; here `y`'s structure comes from a trace of
    `step` that never runs, as `jax.lax.scan` evaluates it abstractly."""
    xs_flat = tf.nest.flatten(xs)
    length = tf.shape(xs_flat[0])[0]

    def xs_at(k):
        return tf.nest.pack_sequence_as(xs, [x[k] for x in xs_flat])

    specs = [tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), init)]
    specs.append(tf.nest.pack_sequence_as(xs, [tf.TensorSpec(x.shape[1:], x.dtype) for x in xs_flat]))
    ys_like = tf.function(lambda carry, x: step(carry, x)[1], autograph=False).get_concrete_function(*specs)
    ys_like = ys_like.structured_outputs
    arrays = [tf.TensorArray(y.dtype, size=length, element_shape=y.shape) for y in tf.nest.flatten(ys_like)]

    def body(k, carry, arrays):
        carry, ys = step(carry, xs_at(k))
        return k + 1, carry, [a.write(k, y) for a, y in zip(arrays, tf.nest.flatten(ys))]

    _, carry, arrays = tf.while_loop(lambda k, *_: k < length, body, [0, init, arrays], parallel_iterations=1)
    return carry, tf.nest.pack_sequence_as(ys_like, [a.stack() for a in arrays])


def segment_sum(data, segment_ids, num_segments):
    return tf.math.unsorted_segment_sum(data, segment_ids, num_segments)


def no_gradient():
    return contextlib.nullcontext()


def unlinked(outputs):
    """The outputs as they are: a gradient function that keeps one holds no cycle here."""
    return outputs
