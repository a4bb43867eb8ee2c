"""The exports' settings, without TensorFlow: `elita-export --help` and `elita-evaluate --help` list them at once."""

QUANTIZATIONS = ("int8",)  # the weights' quantizations a LiteRT file and an evaluation take (None: float weights)
DEFAULT_MAX_NEW_TOKENS = 1024  # the SavedModel's cap on the tokens one `generate` request may ask for


def check_quantize(quantize):
    """Raises ValueError unless `quantize` is None (float weights) or one of `QUANTIZATIONS`."""
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"`quantize` must be None or one of {QUANTIZATIONS}. Received: quantize={quantize!r}")

# `generate`'s `max_new_tokens` is an int32 tensor: a larger cap could never be asked for.
MAX_NEW_TOKENS_LIMIT = 2**31 - 1


def check_max_new_tokens(max_new_tokens):
    """Raises ValueError unless `max_new_tokens` is an integer in `[1, MAX_NEW_TOKENS_LIMIT]`."""
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or not 1 <= max_new_tokens <= MAX_NEW_TOKENS_LIMIT
    ):
        raise ValueError(
            f"`max_new_tokens` must be a positive integer of at most {MAX_NEW_TOKENS_LIMIT} (the `generate` "
            f"signature's int32). Received: max_new_tokens={max_new_tokens!r}"
        )
