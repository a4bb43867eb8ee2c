"""The exports' settings, without TensorFlow: `elita-export --help` and `elita-evaluate --help` list them at once."""

QUANTIZATIONS = ("int8",)  # the weights' quantizations a LiteRT file and an evaluation take (None: float weights)
DEFAULT_MAX_NEW_TOKENS = 1024  # the SavedModel's cap on the tokens one `generate` request may ask for


def check_quantize(quantize):
    """Raises ValueError unless `quantize` is None (float weights) or one of `QUANTIZATIONS`."""
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"`quantize` must be None or one of {QUANTIZATIONS}. Received: quantize={quantize!r}")
