"""Token ids and labels: integers in `[0, V)`, refused by name where their values are known, marked where not.

The model's input ids (`TokenEmbedding`), a prompt (`ElitaCausalLM.generate`) and the loss's labels
(`chunked_cross_entropy`) are checked by these. Eagerly an id out of range raises at once, naming its
position and value; in a TensorFlow graph an assertion fails the step the same way. Where no check can run
(`jax.jit`, XLA), each caller makes what an out-of-range id produces non-finite (a NaN embedding, a NaN
loss), never a plausible number.
"""

import keras
import numpy as np
from keras import ops

from elita_tf import backend


def check_integer_ids(token_ids, vocabulary_size, name="token_ids"):
    """Token ids as a tensor; a float (or any non-integer) dtype is a `TypeError`, never a cast."""
    token_ids = ops.convert_to_tensor(token_ids)
    dtype = keras.backend.standardize_dtype(token_ids.dtype)
    if "int" not in dtype:
        raise TypeError(
            f"Token ids must be integers in [0, {vocabulary_size}); float ids are refused, not rounded. "
            f"Received: {name}.dtype={dtype}"
        )
    return token_ids


def known_values(x):
    """`x` as a NumPy array where its values are known (eagerly), else None (traced: a TensorFlow graph, `jax.jit`,
    Keras' symbolic build)."""
    try:
        return ops.convert_to_numpy(x)
    except Exception:  # each backend refuses a traced tensor with its own error
        return None


def check_token_ids(token_ids, vocabulary_size, name="token_ids", what="Token ids", advice=""):
    """Token ids must be integers in `[0, vocabulary_size)`: floats are refused, never rounded.

    Eagerly, an id out of range raises `ValueError` at once. In a TensorFlow
    graph the check is an assertion on `O(B * T)` integer compares that fails
    the step with the first offending ids and their positions. XLA drops
    assertions, and `jax.jit` has none, so callers also mark what an
    out-of-range id produces (see `TokenEmbedding`).

    Args:
        token_ids: int tensor of any shape.
        vocabulary_size: int, `V`.
        name: str. The argument's name in the message, `name[b, t]=value`.
        what: str. What the ids are, the message's subject ("Labels").
        advice: str. A sentence the message adds after the range.

    Returns:
        `(token_ids, in_range)`: the ids (depending on the assertion in a
        graph) and a bool tensor of their shape.
    """
    token_ids = check_integer_ids(token_ids, vocabulary_size, name)
    in_range = ops.logical_and(token_ids >= 0, token_ids < ops.cast(vocabulary_size, token_ids.dtype))
    message = " ".join(filter(None, [f"{what} must be in [0, vocabulary_size={vocabulary_size}).", advice]))
    values = known_values(token_ids)
    if values is not None:
        outside = np.argwhere((values < 0) | (values >= vocabulary_size))
        if len(outside):
            first = tuple(int(i) for i in outside[0])
            raise ValueError(f"{message} Received: {name}[{', '.join(map(str, first))}]={int(values[first])}")
        return token_ids, in_range

    def report():
        # Computed only when an id is out of range: the offending ids and their positions.
        outside = ops.logical_not(in_range)
        positions = ops.stack(ops.nonzero(outside), axis=1)[:3]
        ids = ops.take(ops.reshape(token_ids, [-1]), ops.nonzero(ops.reshape(outside, [-1]))[0][:3])
        return [f"Received: {name} =", ids, "at", positions]

    checked = backend.check_all(in_range, message, report)
    return backend.ordered([checked], lambda: ops.copy(token_ids)), in_range
