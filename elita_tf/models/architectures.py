"""The architectures: named recipes of `ElitaBackbone` arguments, and the check every backbone's arguments pass.

An architecture is a dict of `ElitaBackbone` arguments. Every recipe keeps width, depth and heads
at the backbone's defaults (or the caller's), so comparisons between them are like for like:

    ElitaBackbone.from_architecture("elita", vocabulary_size=5000)
    elita-train --architecture transformer ...

The `*-reference` recipes wrap the blocks as their original authors did (`docs/differences.md`).
"""

from elita_tf.layers.options import NORMS, POSITION_MODES
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

# The sequence length a backbone's buffers hold, and a run's training length, unless given.
DEFAULT_SEQUENCE_LENGTH = 256

# Model sizes: width, depth and heads, the same for every architecture (`elita-train --hidden-dim ...`).
# "seed" is the backbone's defaults (about 1M parameters at a 5,000-token vocabulary). At that vocabulary,
# ELiTA has 28.3M parameters at "25m" and 86M at "100m" (the Transformer 31.4M and 94M, with its learned
# positions for 2,048 tokens); a larger vocabulary adds `2 * vocabulary_size * hidden_dim`.
MODEL_SIZES = {
    "seed": {"hidden_dim": 64, "num_layers": 6, "num_heads": 4, "head_dim": 16},
    "25m": {"hidden_dim": 512, "num_layers": 8, "num_heads": 8, "head_dim": 64},
    "100m": {"hidden_dim": 768, "num_layers": 12, "num_heads": 12, "head_dim": 64},
}


def _fail(name, value, expected):
    raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def check_architecture(config):
    """`ElitaBackbone`'s arguments (a dict of every one), checked; `blocks` and `sliding_window_sizes` become
    one entry per layer, and numbers and flags their one type, so equal architectures compare equal.

    Raises:
        ValueError: naming the first argument out of range, in Keras' form (`Received: name=value`).
    """
    config = dict(config)
    num_layers = config["num_layers"]
    positive = ("vocabulary_size", "num_layers", "num_heads", "hidden_dim", "head_dim", "ffn_factor", "position_dim")
    for name in positive:
        if not _is_int(config[name]) or config[name] <= 0:
            _fail(name, config[name], "a positive integer")
    if not _is_int(config["max_sequence_length"]) or config["max_sequence_length"] < 2:
        _fail("max_sequence_length", config["max_sequence_length"], "an integer >= 2")
    for name in ("position_scale", "intermediate_dim"):
        minimum = 2 if name == "position_scale" else 1
        if config[name] is not None and (not _is_int(config[name]) or config[name] < minimum):
            _fail(name, config[name], f"None or an integer >= {minimum}")
    if config["position_mode"] not in POSITION_MODES:
        _fail("position_mode", config["position_mode"], f"one of {POSITION_MODES}")
    blocks = config["blocks"]
    per_layer = [blocks] * num_layers if isinstance(blocks, str) else list(blocks)
    per_layer = per_layer * num_layers if len(per_layer) == 1 else per_layer
    if len(per_layer) != num_layers:
        _fail("blocks", blocks, f"one block type, or one per layer ({num_layers})")
    if any(block not in BLOCK_TYPES for block in per_layer):
        _fail("blocks", blocks, f"block types from {BLOCK_TYPES}")
    config["blocks"] = per_layer
    if config["ffn"] not in FFN_TYPES:
        _fail("ffn", config["ffn"], f"one of {FFN_TYPES}")
    sizes = config["sliding_window_sizes"]
    if sizes is not None:
        sizes = config["sliding_window_sizes"] = list(sizes)
        if len(sizes) != num_layers or any(size is not None and (not _is_int(size) or size < 1) for size in sizes):
            _fail(
                "sliding_window_sizes", sizes, f"None or one size (a positive integer or None) per layer ({num_layers})"
            )
    if not isinstance(config["dropout"], (int, float)) or not 0.0 <= config["dropout"] < 1.0:
        _fail("dropout", config["dropout"], "in [0, 1)")
    if config["norm"] is not None and config["norm"] not in NORMS:
        _fail("norm", config["norm"], f"None or one of {NORMS}")
    for name in ("logit_clip", "layer_norm_epsilon", "ffn_init_stddev"):
        value = config[name]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            _fail(name, value, "None or a positive number")
        config[name] = None if value is None else float(value)
    if config["scaled_tied_logits"] and not config["tie_word_embeddings"]:
        raise ValueError(
            "`scaled_tied_logits` scales the tied output layer: set `tie_word_embeddings=True` too. "
            f"Received: scaled_tied_logits=True, tie_word_embeddings={config['tie_word_embeddings']!r}"
        )
    config["dropout"] = float(config["dropout"])
    for name in _FLAGS:
        config[name] = bool(config[name])
    return config


# The arguments that are switches, stored as bools.
_FLAGS = (
    "position_embedding",
    "tie_word_embeddings",
    "embedding_norm",
    "final_norm",
    "scaled_tied_logits",
    "ffn_bias",
    "first_value_projection",
)
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
    """The recipe `name` (a key of `ARCHITECTURES`) as a dict of backbone arguments.

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
