"""The argument checks of the settings, the architecture and the layers: one function a rule, no TensorFlow.

Every check raises `ValueError` in one form, Keras', naming what it expected and the value received:

    `dropout` must be in [0, 1). Received: dropout=1.5

A setting is checked by the same function at each of its three places: `--dropout` by
`TrainSettings.dropout`, `ElitaBackbone(dropout=...)` and `DecoderBlock(dropout=...)` alike call
`check_dropout`, and `--sequence-length`, `max_sequence_length` and the layers'
`max_sequence_length` call `check_sequence_length`. The layers' checks of tensors (shapes, dtypes,
caches) are `elita_tf.layers.checks`.
"""

# The largest values that reach TensorFlow and SentencePiece intact: shapes and sizes are int32, step and
# batch counts int64, and seeds go to numpy's `np.random.seed`, which takes 32 bits.
INT32_MAX, INT64_MAX, SEED_MAX = 2**31 - 1, 2**63 - 1, 2**32 - 1


def fail(name, value, expected):
    """Raises every check's `ValueError`: what `name` must be, and the value received.

    Example:
    >>> fail("num_heads", 0, "a positive integer")
    Traceback (most recent call last):
    ValueError: `num_heads` must be a positive integer. Received: num_heads=0
    """
    raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")


def is_integer(value):
    """Whether `value` is an int and not a bool (`True` is an int to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_integer(name, value, least=1, most=INT32_MAX, optional=False):
    """`value` when it is an integer in `[least, most]` (or None, with `optional`), else `fail`.

    Example:
    >>> check_integer("seed", -1, least=0)
    Traceback (most recent call last):
    ValueError: `seed` must be a non-negative integer. Received: seed=-1
    """
    if (optional and value is None) or (is_integer(value) and least <= value <= most):
        return value
    if is_integer(value) and value > most:
        fail(name, value, f"at most {most}")
    expected = {0: "a non-negative integer", 1: "a positive integer"}.get(least, f"an integer >= {least}")
    fail(name, value, f"None or {expected}" if optional else expected)


def check_sequence_length(name, value, optional=False):
    """A length in tokens (a training example, a buffer of positions): an integer >= 2, a token and the next
    one it predicts.

    Example:
    >>> check_sequence_length("max_sequence_length", 1)
    Traceback (most recent call last):
    ValueError: `max_sequence_length` must be an integer >= 2. Received: max_sequence_length=1
    """
    return check_integer(name, value, least=2, optional=optional)


def check_dropout(name, value):
    """A dropout rate: a number in `[0, 1)`, returned as a float.

    Example:
    >>> check_dropout("dropout", 1.5)
    Traceback (most recent call last):
    ValueError: `dropout` must be in [0, 1). Received: dropout=1.5
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        fail(name, value, "in [0, 1)")
    return float(value)


def check_positive_number(name, value, optional=False):
    """A number above 0 (or None, with `optional`), returned as a float (or None)."""
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        fail(name, value, "None or a positive number" if optional else "a positive number")
    return float(value)


def check_choice(name, value, choices):
    """`value` when it is one of `choices`, else `fail` listing them.

    Example:
    >>> check_choice("residual", "post_norm", ("pre_norm", "parallel"))
    Traceback (most recent call last):
    ValueError: `residual` must be one of ['pre_norm', 'parallel']. Received: residual='post_norm'
    """
    if value not in choices:
        fail(name, value, f"one of {list(choices)}")
    return value
