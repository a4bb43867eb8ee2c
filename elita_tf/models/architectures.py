"""The architectures: named `ElitaBackbone` configs (its arguments), and the check every backbone's arguments pass.

An architecture is a name; its config is a dict of `ElitaBackbone` arguments. Every architecture keeps
width, depth and heads at the backbone's defaults (or the caller's), so comparisons between them are like
for like:

    ElitaBackbone.from_architecture("elita", vocabulary_size=5000)
    elita-train --architecture transformer ...

The `*-reference` architectures wrap the blocks as their original authors did (`docs/differences.md`).
"""

import functools

from elita_tf.checks import (
    check_choice,
    check_dropout,
    check_integer,
    check_positive_number,
    check_sequence_length,
    fail,
    is_integer,
)
from elita_tf.layers.options import DEFAULT_SEQUENCE_LENGTH, NORMS, POSITION_MODES
from elita_tf.layers.renamed_arguments import upgrade_arguments

BLOCK_TYPES = ("elita", "transformer", "simplified", "linear", "3lin", "additive")
FFN_TYPES = ("feedforward2", "mlp", "wide", "none")
# Blocks whose decoding cache holds `max_sequence_length` positions (key/value buffers, 3Lin's wide layers).
FINITE_BUFFER_BLOCKS = ("transformer", "simplified", "3lin")

ARCHITECTURES = {
    "elita": {"blocks": "elita", "ffn": "feedforward2"},
    # ELiTA as its original code runs: positions i / (T - 1) that move with the length, logits clipped at ±20.
    "elita-reference": {"blocks": "elita", "ffn": "feedforward2", "position_mode": "length", "logit_clip": 20.0},
    "transformer": {"blocks": "transformer", "ffn": "mlp", "position_embedding": True},
    "simplified": {"blocks": "simplified", "ffn": "mlp", "position_embedding": True},
    "simplified-wide": {"blocks": "simplified", "ffn": "wide", "position_embedding": True},
    "linear": {"blocks": "linear", "ffn": "mlp", "position_embedding": True},
    # A short convolution (`ShortConvolution(4)`) before every mixer: the token shift of the linear models that recall.
    "elita-conv": {"blocks": "elita", "ffn": "feedforward2", "short_convolution": 4},
    "linear-conv": {"blocks": "linear", "ffn": "mlp", "position_embedding": True, "short_convolution": 4},
    # ELiTA with a Transformer block (softmax attention over every position, no learned positions) in every 3,
    # the first one among them: the hybrid of linear-time models with a few global attention layers.
    "elita-hybrid": {"blocks": "elita", "ffn": "feedforward2", "attention_interval": 3},
    # Both: the short convolution gives the attention blocks each position's predecessors to match on. The one
    # hybrid here that recalls (docs/results.md).
    "elita-conv-hybrid": {"blocks": "elita", "ffn": "feedforward2", "short_convolution": 4, "attention_interval": 3},
    "3lin": {"blocks": "3lin", "ffn": "none"},
    "additive": {"blocks": "additive", "ffn": "mlp", "position_embedding": True},
    "additive-reference": {
        "blocks": "additive",
        "ffn": "mlp",
        "position_embedding": True,
        "embedding_norm": True,
        "final_norm": False,
        "tie_word_embeddings": True,
        "scaled_tied_logits": True,
        "ffn_bias": False,
        "ffn_init_stddev": 0.02,
        "layer_norm_epsilon": 1e-5,
    },
    # The authors' GPT-2 wrapper: RMSNorm as their code computes it, GPT-2's epsilon 1e-5 (final
    # LayerNorm included), a tied output layer, a learned value projection in the first block.
    "simplified-reference": {
        "blocks": "simplified",
        "ffn": "mlp",
        "position_embedding": True,
        "tie_word_embeddings": True,
        "first_value_projection": True,
        "norm": "rms_norm_outer_epsilon",
        "layer_norm_epsilon": 1e-5,
    },
}

# Model sizes: width, depth and heads, the same for every architecture (`elita-train --hidden-dim ...`).
# "seed" is the backbone's defaults (about 1M parameters at a 5,000-token vocabulary). At that vocabulary,
# ELiTA has 28.3M parameters at "25m" and 86M at "100m" (the Transformer 31.4M and 94M, with its learned
# positions for 2,048 tokens); a larger vocabulary adds `2 * vocabulary_size * hidden_dim`.
MODEL_SIZES = {
    "seed": {"num_layers": 6, "num_heads": 4, "hidden_dim": 64, "head_dim": 16},
    "25m": {"num_layers": 8, "num_heads": 8, "hidden_dim": 512, "head_dim": 64},
    "100m": {"num_layers": 12, "num_heads": 12, "hidden_dim": 768, "head_dim": 64},
}


def _flag(name, value):
    return bool(value)


def _block_types(name, value):
    """One block type, or a sequence of them, as a list (one entry per layer once `num_layers` is known)."""
    per_layer = [value] if isinstance(value, str) else list(value)
    if not per_layer or any(block not in BLOCK_TYPES for block in per_layer):
        fail(name, value, f"block types from {BLOCK_TYPES}")
    return per_layer


def _sliding_window_sizes(name, value):
    """None, or sizes (a positive integer or None) as a list (one per layer once `num_layers` is known)."""
    if value is None:
        return None
    if any(size is not None and (not is_integer(size) or size < 1) for size in value):
        fail(name, list(value), "None or one size (a positive integer or None) per layer")
    return list(value)


def _choice(choices):
    return functools.partial(check_choice, choices=choices)


def _optional(check):
    return functools.partial(check, optional=True)


# Every `ElitaBackbone` argument that is its architecture (all but `lora_rank` and `dtype`), in its signature's
# order, and its check (`elita_tf.checks`), which returns the value in its one type: equal architectures compare
# equal. `ElitaBackbone`'s signature lists the same names (tests/models/test_elita_backbone.py).
ARGUMENT_CHECKS = {
    "vocabulary_size": check_integer,
    "num_layers": check_integer,
    "num_heads": check_integer,
    "hidden_dim": check_integer,
    "head_dim": check_integer,
    "max_sequence_length": check_sequence_length,
    "intermediate_dim": _optional(check_integer),
    "position_scale": _optional(check_sequence_length),
    "position_mode": _choice(POSITION_MODES),
    "logit_clip": _optional(check_positive_number),
    "blocks": _block_types,
    "ffn": _choice(FFN_TYPES),
    "ffn_factor": check_integer,
    "position_dim": check_integer,
    "position_embedding": _flag,
    "sliding_window_sizes": _sliding_window_sizes,
    "dropout": check_dropout,
    "tie_word_embeddings": _flag,
    "norm": _choice((None, *NORMS)),
    "layer_norm_epsilon": _optional(check_positive_number),
    "embedding_norm": _flag,
    "final_norm": _flag,
    "scaled_tied_logits": _flag,
    "ffn_bias": _flag,
    "ffn_init_stddev": _optional(check_positive_number),
    "first_value_projection": _flag,
    "short_convolution": _optional(check_integer),
    "attention_interval": _optional(check_integer),
}
# The arguments every saved config holds, elita-tf 0.1.0's too: the vocabulary, the size, the length and the
# blocks, without which a preset's weights cannot be placed.
REQUIRED_ARGUMENTS = ("vocabulary_size", *MODEL_SIZES["seed"], "max_sequence_length", "blocks")


def check_architecture(config):
    """`ElitaBackbone`'s arguments (a dict of every one), checked; `blocks` and `sliding_window_sizes` become
    one entry per layer, and numbers and flags their one type, so equal architectures compare equal.

    Raises:
        ValueError: naming the first argument out of range, in Keras' form (`Received: name=value`).
    """
    config = dict(config)
    for name, check in ARGUMENT_CHECKS.items():
        config[name] = check(name, config[name])
    num_layers = config["num_layers"]
    if len(config["blocks"]) == 1:
        config["blocks"] = config["blocks"] * num_layers
    if len(config["blocks"]) != num_layers:
        fail("blocks", config["blocks"], f"one block type, or one per layer ({num_layers})")
    interval = config["attention_interval"]
    if interval is not None:  # the first block and every `interval`-th above it: the bottom always attends
        config["blocks"] = ["transformer" if i % interval == 0 else block for i, block in enumerate(config["blocks"])]
    sizes = config["sliding_window_sizes"]
    if sizes is not None and len(sizes) != num_layers:
        fail("sliding_window_sizes", sizes, f"None or one size (a positive integer or None) per layer ({num_layers})")
    if config["scaled_tied_logits"] and not config["tie_word_embeddings"]:
        raise ValueError(
            "`scaled_tied_logits` scales the tied output layer: set `tie_word_embeddings=True` too. "
            f"Received: scaled_tied_logits=True, tie_word_embeddings={config['tie_word_embeddings']!r}"
        )
    return config


def upgrade_config(config):
    """An `ElitaBackbone` config (or a run's recorded architecture) written by an older elita-tf, in today's names.

    Presets, checkpoints and run directories of elita-tf 0.1.0 load through it
    (`layers.renamed_arguments` holds the old names). A config in today's names is returned as it is.

    Example:
    >>> upgrade_config({"vocabulary_size": 100, "tied_embeddings": True})
    {'vocabulary_size': 100, 'tie_word_embeddings': True}
    """
    return upgrade_arguments("ElitaBackbone", config)


def architecture(name):
    """The config of architecture `name` (a key of `ARCHITECTURES`): a dict of backbone arguments.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if name not in ARCHITECTURES:
        raise ValueError(f"Unknown architecture. Expected one of {sorted(ARCHITECTURES)}. Received: name={name!r}")
    return dict(ARCHITECTURES[name])


def decode_limit(blocks, position_embedding, max_sequence_length):
    """The positions generation can reach: `max_sequence_length` where something is sized by it, else None.

    Key/value buffers (`"transformer"`, `"simplified"`), 3Lin's wide layers and
    learned position tables hold `max_sequence_length` positions. ELiTA, linear
    and additive blocks carry constant-size states, and ELiTA's sinusoidal
    positions continue past it: such a model decodes with no length limit.
    """
    finite = position_embedding or any(block in FINITE_BUFFER_BLOCKS for block in blocks)
    return max_sequence_length if finite else None


def carries_state(config):
    """Whether a model of architecture `config` can carry its state over a stream of any length
    (`ElitaBackbone.carries_state`): every block keeps a constant-size state, there are no learned positions,
    and positions do not move with the length."""
    limit = decode_limit(config["blocks"], config["position_embedding"], config["max_sequence_length"])
    return limit is None and config["position_mode"] != "length"


def check_carries_state(config):
    """Raises the one `ValueError` of a model that cannot carry its state (`carries_state`)."""
    if not carries_state(config):
        raise ValueError(
            "Carrying the state over a stream needs blocks that keep a constant-size state (elita, linear, "
            "additive), no learned positions and positions that do not move with the length. Received: "
            f"blocks={sorted(set(config['blocks']))}, position_embedding={config['position_embedding']}, "
            f"position_mode={config['position_mode']!r}"
        )
