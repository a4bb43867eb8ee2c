"""The public names elita-tf 0.1.0 spelled otherwise, in one table, and the one way each old spelling still works.

An old name works for one more release beside today's, with a `FutureWarning` (Python's warning for
the users of a deprecated feature, shown by default) that names today's:

    kind          an old name                       what answers it
    flag          `--window-length`                 `add_flags` (`elita_tf.cli.flags`): hidden from `--help`,
                                                    one line on stderr
    name          `elita_tf.layers.WideFeedForward` its package's `__getattr__` (`renamed_attribute`)
    argument      `FeedForward2(hidden_dim=...)`    `accepts_renamed_arguments` on the class or function
    result key    `evaluate(...)["windows"]`        `RenamedKeys`, the dict the function returns

A config, checkpoint, `.keras` file or run directory that 0.1.0 wrote loads in today's names without
a word (`upgrade_arguments`): nothing in it is its user's to change. A name that goes with no successor
of its own (`DEPRECATED`: the in-memory cutters, whose work the token files do) works for one more
release too, with a `FutureWarning` saying what does its work. No TensorFlow here: every package, the
command lines' too, reads this table.
"""

import functools
import importlib
import inspect
import warnings

_BACKBONE = {
    "norm_epsilon": "layer_norm_epsilon",
    "tied_embeddings": "tie_word_embeddings",
    "windows": "sliding_window_sizes",
}
_DOCUMENT_STARTS = {"resets": "document_starts"}
_SEQUENCES = {"windows": "sequences"}

# Kind: {old name: today's}.
RENAMED = {
    # Every command that has today's flag takes the old one.
    "flag": {"--window-length": "--sequence-length", "--documents": "--document-separator", "--settings": "--tasks"},
    # Public names, by the package that exported them: today's may live in another module.
    "name": {
        "elita_tf.layers.WideFeedForward": "elita_tf.layers.FeedForward",
        "elita_tf.ops.empty_state": "elita_tf.ops.empty_softmax_mean_state",
        "elita_tf.ops.DEFAULT_CHUNK_SIZE": "elita_tf.ops.causal_softmax_mean.SOFTMAX_MEAN_CHUNK_SIZE",
    },
    # Arguments, by the function's qualified name, or the class's for its constructor and config.
    "argument": {
        "ElitaBackbone": _BACKBONE,
        "ElitaBackbone.from_architecture": _BACKBONE,
        "architecture_config": _BACKBONE,
        "DecoderBlock": {"norm_epsilon": "layer_norm_epsilon"},
        "FeedForward2": {"hidden_dim": "intermediate_dim"},
        # 0.1.0's `WideFeedForward(width, num_layers)`.
        "FeedForward": {"width": "intermediate_dim", "num_layers": "shared_by"},
        "AdditiveAttention": {"window": "sliding_window_size"},
        "TriLinearAttention": {"window": "sliding_window_size"},
        # As a run's manifest records them (`data.corpus`).
        "CorpusSettings": {"documents": "document_separator"},
        "causal_softmax_mean": _DOCUMENT_STARTS,
        "causal_linear_attention": _DOCUMENT_STARTS,
        "banded_attention": _DOCUMENT_STARTS,
        "CausalMixer.call": _DOCUMENT_STARTS,
        "PositionEmbedding.call": _DOCUMENT_STARTS,
        "DecoderBlock.call": _DOCUMENT_STARTS,
        "ElitaBackbone.hidden_states": _DOCUMENT_STARTS,
        "stream_dataset": _DOCUMENT_STARTS,
        "lm_dataset": _SEQUENCES,
        "steps_per_epoch": _SEQUENCES,
        "LiteRTModel.loss": _SEQUENCES,
        "list_checkpoints": {"run_dir": "run_path"},
        "compare": {"budget_s": "budget_seconds"},
        "RecallSettings": {"settings": "tasks"},
        "packed_sequences": _DOCUMENT_STARTS,
    },
    # Keys of the dicts a function returns, by the function. (`evaluate`'s `trained_sequence_length` was
    # `sequence_length`, which is now the evaluation's length: a key that changed meaning cannot be read both ways.)
    "result key": {"evaluate": {"window_length": "sequence_length", "windows": "sequences"}},
}


_TOKEN_FILES = "write the split's token files (tokens = elita_tf.data.token_files.write_token_file(...)) and read them"
_SEQUENCES_OF = _TOKEN_FILES + ": FileSequences(tokens, T + 1) for lm_dataset"
_CUTTERS = "elita_tf.data.deprecated"
# Public names that go with the next release, without a successor of their own, by the package that exported them:
# (what still answers them, what does their work).
DEPRECATED = {
    "elita_tf.data.token_sequences": (f"{_CUTTERS}.token_sequences", _SEQUENCES_OF),
    "elita_tf.data.token_windows": (f"{_CUTTERS}.token_sequences", _SEQUENCES_OF),
    "elita_tf.data.packed_sequences": (f"{_CUTTERS}.packed_sequences", _SEQUENCES_OF + " with document_starts=True"),
    "elita_tf.data.packed_windows": (f"{_CUTTERS}.packed_sequences", _SEQUENCES_OF + " with document_starts=True"),
    "elita_tf.data.token_stream": (f"{_CUTTERS}.token_stream", _TOKEN_FILES + ": tokens.stream()"),
}
# `lm_dataset`'s NumPy sequences, deprecated with the cutters that made them.
ARRAY_SEQUENCES = f"`lm_dataset`'s NumPy sequences are deprecated and go in the next release: {_SEQUENCES_OF}."


def deprecation(old, new, received=None):
    """The one line every old name is answered with.

    Example:
    >>> deprecation("--window-length", "--sequence-length", "--window-length 4096")
    '--window-length is deprecated: use --sequence-length. Received: --window-length 4096'
    """
    return f"{old} is deprecated: use {new}." + (f" Received: {received}" if received is not None else "")


def warn_renamed(old, new, received=None, stacklevel=2):
    """A `FutureWarning` that `old` is deprecated for `new`, attributed to the caller `stacklevel` frames up
    (`warnings.warn`'s count, from the caller of this function)."""
    warnings.warn(deprecation(old, new, received), FutureWarning, stacklevel=stacklevel + 1)


def upgrade_arguments(where, arguments):
    """`arguments`, those of `where` (a class or function, `RENAMED["argument"]`'s key) as any elita-tf named them,
    in today's names, silently: what a saved file holds.

    Example:
    >>> upgrade_arguments("FeedForward2", {"hidden_dim": 12, "factor": 8})
    {'intermediate_dim': 12, 'factor': 8}
    """
    renamed = RENAMED["argument"].get(where, {})
    return {renamed.get(name, name): value for name, value in arguments.items()}


def _brief(value):
    """`value` as a message shows it: its repr when short (a number, a name), else its type."""
    text = repr(value)
    return text if len(text) <= 40 else f"<{type(value).__name__}>"


def accepts_renamed_arguments(function):
    """`function`, taking its arguments' old names (`RENAMED["argument"]`) too, each with a `FutureWarning`.

    The table's key is the function's qualified name (`"causal_softmax_mean"`, `"CausalMixer.call"`),
    or its class's name for a constructor (`"FeedForward2"`); a function without one fails here, at import.
    """
    where = function.__qualname__.removesuffix(".__init__")
    renamed = RENAMED["argument"][where]

    @functools.wraps(function)
    def with_old_names(*args, **kwargs):
        for old in sorted(renamed.keys() & kwargs.keys()):
            new, value = renamed[old], kwargs.pop(old)
            if new in kwargs:
                raise TypeError(
                    f"{where}() got `{old}` and `{new}`, one argument under its old and its new name: pass `{new}`. "
                    f"Received: {old}={_brief(value)}, {new}={_brief(kwargs[new])}"
                )
            warn_renamed(f"`{where}`'s argument `{old}`", f"`{new}`", f"{old}={_brief(value)}")
            kwargs[new] = value
        return function(*args, **kwargs)

    # Keras binds a layer's call to its `call`'s signature, and reads a constructor's (`Operation.__new__`, through
    # `getfullargspec`, which follows no `__wrapped__`): the old names are keyword-only there unless `**kwargs`
    # takes them already.
    signature = inspect.signature(function)
    parameters = list(signature.parameters.values())
    if not any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        parameters += [inspect.Parameter(old, inspect.Parameter.KEYWORD_ONLY, default=None) for old in renamed]
    with_old_names.__signature__ = signature.replace(parameters=parameters)
    with_old_names.renamed_arguments = renamed
    return with_old_names


def renamed_attribute(package, name):
    """Today's object for an old public name `package.name` (`RENAMED["name"]`), or the one that still answers a
    deprecated name (`DEPRECATED`), with a `FutureWarning`: a package's `__getattr__`. Any other name raises Python's
    own `AttributeError`."""
    old = f"{package}.{name}"
    if old in DEPRECATED:
        new, work = DEPRECATED[old]
        warnings.warn(f"`{old}` is deprecated and goes in the next release: {work}.", FutureWarning, stacklevel=3)
    elif old in RENAMED["name"]:
        new = RENAMED["name"][old]
        warn_renamed(f"`{old}`", f"`{new}`", stacklevel=3)  # the line that names it, past `__getattr__`
    else:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module, _, attribute = new.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


class RenamedKeys(dict):
    """The dict function `where` returns, which also answers its keys' old names (`RENAMED["result key"]`).

    An old key reads today's value, with a `FutureWarning`; only today's keys are in the dict (`in`,
    iteration, `json.dumps`).

    Example:
    >>> result = RenamedKeys("evaluate", {"sequences": 12})
    >>> result["windows"]  # doctest: +SKIP
    FutureWarning: `evaluate`'s result key 'windows' is deprecated: use 'sequences'.
    12
    """

    def __init__(self, where, items):
        super().__init__(items)
        self._where, self._renamed = where, RENAMED["result key"][where]

    def __missing__(self, key):
        if key not in self._renamed:
            raise KeyError(key)
        warn_renamed(f"`{self._where}`'s result key {key!r}", repr(self._renamed[key]))
        return self[self._renamed[key]]

    def get(self, key, default=None):
        return self[key] if key in self or self._renamed.get(key) in self else default
