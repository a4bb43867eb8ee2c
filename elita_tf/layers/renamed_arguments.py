"""The arguments elita-tf 0.1.0 named otherwise, without TensorFlow: its configs load in today's names.

keras-hub's names replaced them (`layer_norm_epsilon`, `tie_word_embeddings`, `intermediate_dim`,
`sliding_window_size(s)`). Presets, checkpoints, run directories and `.keras` files of 0.1.0 load
through `upgrade_arguments`, the one place that knows the old names: `ElitaBackbone`'s
(`architectures.upgrade_config`) and each layer's `from_config`.
"""

# Class name: {old argument name: today's}.
RENAMED_ARGUMENTS = {
    "ElitaBackbone": {
        "norm_epsilon": "layer_norm_epsilon",
        "tied_embeddings": "tie_word_embeddings",
        "windows": "sliding_window_sizes",
    },
    "DecoderBlock": {"norm_epsilon": "layer_norm_epsilon"},
    "FeedForward2": {"hidden_dim": "intermediate_dim"},
    # 0.1.0's `WideFeedForward(width, num_layers)`, registered under that name too (feed_forward.py).
    "FeedForward": {"width": "intermediate_dim", "num_layers": "shared_by"},
    "AdditiveAttention": {"window": "sliding_window_size"},
    "TriLinearAttention": {"window": "sliding_window_size"},
}


def upgrade_arguments(class_name, config):
    """`config`, the arguments of class `class_name` as any elita-tf wrote them, in today's names.

    Example:
    >>> upgrade_arguments("FeedForward2", {"hidden_dim": 12, "factor": 8})
    {'intermediate_dim': 12, 'factor': 8}
    """
    renamed = RENAMED_ARGUMENTS.get(class_name, {})
    return {renamed.get(name, name): value for name, value in config.items()}


class UpgradesRenamedArguments:
    """A layer mixin: `from_config` takes a config of elita-tf 0.1.0 (its argument names) too."""

    @classmethod
    def from_config(cls, config):
        return super().from_config(upgrade_arguments(cls.__name__, config))
