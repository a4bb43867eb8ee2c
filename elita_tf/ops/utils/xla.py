"""Choices the data makes, made the cheapest way for where the graph runs (a CPU, XLA or a GPU)."""

import tensorflow as tf

from elita_tf.private_apis import in_xla_context


def compiled_or_on_gpu():
    """Whether the graph being traced is compiled by XLA, or a GPU is visible to TensorFlow."""
    return in_xla_context(tf.compat.v1.get_default_graph()) or bool(tf.config.list_logical_devices("GPU"))


def branch_or_select(usual, fast, general):
    """`fast()` where the scalar bool `usual` holds, else `general()`, which is right in every case.

    A choice the data makes, made the cheapest way for where it runs:
    - on a CPU without XLA, a `tf.cond`: the general form, an extra pass, runs only when needed;
    - traced for XLA, or with a GPU visible, `general()` alone, no branch. A branch copies its
      predicate to the host, and under XLA ends the GPU's command buffer there: on a GPU that costs
      more than the extra pass, which XLA fuses into its neighbours.
    """
    if compiled_or_on_gpu():
        return general()
    return tf.cond(usual, fast, general)
