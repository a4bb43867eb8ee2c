"""The layer arguments elita-tf 0.1.0 named otherwise, without TensorFlow: its configs load in today's names.

keras-hub's names replaced them (`layer_norm_epsilon`, `tie_word_embeddings`, `intermediate_dim`,
`sliding_window_size(s)`). The old names are `elita_tf.renames.RENAMED["argument"]`'s, the one
table of renamed public names: presets, checkpoints, run directories and `.keras` files of 0.1.0
load through `upgrade_arguments` (`ElitaBackbone`'s `architectures.upgrade_config` and each
layer's `from_config`), and a constructor given an old name takes it with a `FutureWarning`.
"""

from elita_tf.renames import RENAMED, accepts_renamed_arguments, upgrade_arguments

RENAMED_ARGUMENTS = RENAMED["argument"]


class UpgradesRenamedArguments:
    """A layer mixin: `from_config` takes a config of elita-tf 0.1.0 (its argument names), and the constructor
    takes those names too, each with a `FutureWarning` naming today's."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__ and cls.__name__ in RENAMED_ARGUMENTS:
            cls.__init__ = accepts_renamed_arguments(cls.__init__)

    @classmethod
    def from_config(cls, config):
        return super().from_config(upgrade_arguments(cls.__name__, config))
