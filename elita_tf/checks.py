"""The argument checks of the settings, the architecture, the layers and the ops: one function a rule, no TensorFlow.

Every check raises `ValueError` in one form, Keras', naming what it expected and the value received:

    `dropout` must be in [0, 1). Received: dropout=1.5

A setting is checked by the same function at each of its three places: `--dropout` by
`TrainSettings.dropout`, `ElitaBackbone(dropout=...)` and `DecoderBlock(dropout=...)` alike call
`check_dropout`, and `--sequence-length`, `max_sequence_length` and the layers'
`max_sequence_length` call `check_sequence_length`. The layers' checks of tensors (shapes, dtypes,
caches) are `elita_tf.layers.checks`.
"""

import os

# The largest values that reach TensorFlow and SentencePiece intact: shapes and sizes are int32, step and
# batch counts int64, and seeds go to numpy's `np.random.seed`, which takes 32 bits.
INT32_MAX, INT64_MAX, SEED_MAX = 2**31 - 1, 2**63 - 1, 2**32 - 1
# The smallest vocabulary SentencePiece trains: its special pieces (<unk>, <s>, </s>), the word boundary
# that starts every text and one character. Below it its trainer fails inside, in words no user can act on.
MIN_VOCABULARY_SIZE = 5
# SentencePiece's byte fallback: the 3 special pieces, the 256 byte pieces, a character and a longer piece.
MIN_BYTE_FALLBACK_VOCABULARY = 3 + 256 + 2


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
    if hasattr(value, "__index__") and not isinstance(value, (int, bool)):  # NumPy's integers, 0-d int arrays
        expected += ", a Python int (`int(x)`): it goes into the JSON of a config"
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


def check_vocabulary_size(name, value):
    """A SentencePiece vocabulary's size: an integer in `[MIN_VOCABULARY_SIZE, INT32_MAX]`.

    Example:
    >>> check_vocabulary_size("vocabulary_size", 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: `vocabulary_size` must be an integer >= 5: SentencePiece's 3 special pieces, ... Received: vocabulary_size=2
    """
    if is_integer(value) and value < MIN_VOCABULARY_SIZE:
        pieces = "SentencePiece's 3 special pieces, the word boundary and a character"
        fail(name, value, f"an integer >= {MIN_VOCABULARY_SIZE}: {pieces}")
    return check_integer(name, value, least=MIN_VOCABULARY_SIZE)


def check_byte_fallback_vocabulary(name, value):
    """A vocabulary that holds SentencePiece's byte pieces: `MIN_BYTE_FALLBACK_VOCABULARY` pieces or more.

    Example:
    >>> check_byte_fallback_vocabulary("vocabulary_size", 100)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: `vocabulary_size` must be at least 261 with byte fallback: ... Received: vocabulary_size=100
    """
    if not is_integer(value) or value < MIN_BYTE_FALLBACK_VOCABULARY:
        pieces = "the 3 special pieces, the 256 byte pieces, a character and a longer piece"
        fail(name, value, f"at least {MIN_BYTE_FALLBACK_VOCABULARY} with byte fallback: {pieces}")
    return value


def check_path(name, value):
    """A path: a non-empty `str` (or `os.PathLike`).

    Example:
    >>> check_path("run_dir", None)
    Traceback (most recent call last):
    ValueError: `run_dir` must be a path, a non-empty str. Received: run_dir=None
    """
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        fail(name, value, "a path, a non-empty str")
    return value


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


def check_non_negative_number(name, value):
    """A number at least 0, returned as a float.

    Example:
    >>> check_non_negative_number("weight_decay", -1)
    Traceback (most recent call last):
    ValueError: `weight_decay` must be a non-negative number. Received: weight_decay=-1
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        fail(name, value, "a non-negative number")
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
