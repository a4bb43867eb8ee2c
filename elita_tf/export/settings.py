"""The exports' settings, without TensorFlow: `elita-export --help` and `elita-evaluate --help` list them at once."""

QUANTIZATIONS = ("int8",)  # the weights' quantizations a LiteRT file and an evaluation take (None: float weights)
DEFAULT_MAX_NEW_TOKENS = 1024  # the SavedModel's cap on the tokens one `generate` request may ask for
