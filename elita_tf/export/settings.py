"""The exports' settings, without TensorFlow: `elita-export --help` and `elita-evaluate --help` list them at once."""

from elita_tf.checks import INT32_MAX, check_choice, check_integer

QUANTIZATIONS = ("int8",)  # the weights' quantizations a LiteRT file and an evaluation take (None: float weights)
DEFAULT_MAX_NEW_TOKENS = 1024  # the SavedModel's cap on the tokens one `generate` request may ask for


def check_quantize(quantize):
    """Raises ValueError unless `quantize` is None (float weights) or one of `QUANTIZATIONS`."""
    if quantize is not None:
        check_choice("quantize", quantize, QUANTIZATIONS)


# `generate`'s `max_new_tokens` is an int32 tensor: a larger cap could never be asked for.
MAX_NEW_TOKENS_LIMIT = INT32_MAX


def check_max_new_tokens(max_new_tokens):
    """Raises ValueError unless `max_new_tokens` is an integer in `[1, MAX_NEW_TOKENS_LIMIT]`."""
    check_integer("max_new_tokens", max_new_tokens, most=MAX_NEW_TOKENS_LIMIT)
