"""The architectures: named recipes of `ElitaBackbone` arguments, and the check every backbone's arguments pass.

An architecture is a dict of `ElitaBackbone` arguments. Every recipe keeps width, depth and heads
at the backbone's defaults (or the caller's), so comparisons between them are like for like:

    ElitaBackbone.from_architecture("elita", vocabulary_size=5000)
    elita-train --architecture transformer ...

The `*-reference` recipes wrap the blocks as their original authors did (`docs/differences.md`).
"""

BLOCK_TYPES = ("elita", "transformer", "simplified", "linear", "3lin", "additive")
FFN_TYPES = ("feedforward2", "mlp", "wide", "none")
POSITION_MODES = ("fixed", "clamped", "length")  # Attention2's; "length" cannot decode
NORMS = ("layer_norm", "unscaled_layer_norm", "rms_norm", "rms_norm_outer_epsilon")
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
        "tied_embeddings": True,
        "scaled_tied_logits": True,
        "ffn_bias": False,
        "ffn_init_stddev": 0.02,
        "norm_epsilon": 1e-5,
    },
    # The authors' GPT-2 wrapper: RMSNorm as their code computes it, GPT-2's epsilon 1e-5 (final
    # LayerNorm included), a tied output layer, a learned value projection in the first block.
    "simplified-reference": {
        "blocks": "simplified",
        "ffn": "mlp",
        "position_embedding": True,
        "tied_embeddings": True,
        "first_value_projection": True,
        "norm": "rms_norm_outer_epsilon",
        "norm_epsilon": 1e-5,
    },
}

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


def check_architecture(
    vocabulary_size,
    num_layers,
    num_heads,
    hidden_dim,
    head_dim,
    max_sequence_length,
    position_scale,
    position_mode,
    logit_clip,
    blocks,
    ffn,
    ffn_factor,
    position_dim,
    position_embedding,
    windows,
    dropout,
    tied_embeddings,
    norm,
    norm_epsilon,
    embedding_norm,
    final_norm,
    scaled_tied_logits,
    ffn_bias,
    ffn_init_stddev,
    first_value_projection,
):
    """The `ElitaBackbone` arguments, checked, with `blocks` and `windows` as one list entry per layer.

    Raises:
        ValueError: naming the first argument out of range, in Keras' form (`Received: name=value`).
    """
    for name in ("vocabulary_size", "num_layers", "num_heads", "hidden_dim", "head_dim", "ffn_factor", "position_dim"):
        value = locals()[name]
        if not _is_int(value) or value <= 0:
            _fail(name, value, "a positive integer")
    if not _is_int(max_sequence_length) or max_sequence_length < 2:
        _fail("max_sequence_length", max_sequence_length, "an integer >= 2")
    if position_scale is not None and (not _is_int(position_scale) or position_scale < 2):
        _fail("position_scale", position_scale, "None or an integer >= 2")
    if position_mode not in POSITION_MODES:
        _fail("position_mode", position_mode, f"one of {POSITION_MODES}")
    if logit_clip is not None and (
        not isinstance(logit_clip, (int, float)) or isinstance(logit_clip, bool) or logit_clip <= 0
    ):
        _fail("logit_clip", logit_clip, "None or a positive number")
    per_layer = [blocks] * num_layers if isinstance(blocks, str) else list(blocks)
    if len(per_layer) == 1:
        per_layer = per_layer * num_layers
    if len(per_layer) != num_layers:
        _fail("blocks", blocks, f"one block type, or one per layer ({num_layers})")
    for block in per_layer:
        if block not in BLOCK_TYPES:
            _fail("blocks", blocks, f"block types from {BLOCK_TYPES}")
    if ffn not in FFN_TYPES:
        _fail("ffn", ffn, f"one of {FFN_TYPES}")
    if windows is not None:
        windows = list(windows)
        if len(windows) != num_layers:
            _fail("windows", windows, f"None or one window (int or None) per layer ({num_layers})")
        for window in windows:
            if window is not None and (not _is_int(window) or window < 1):
                _fail("windows", windows, "None or one window (a positive integer or None) per layer")
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        _fail("dropout", dropout, "in [0, 1)")
    if norm is not None and norm not in NORMS:
        _fail("norm", norm, f"None or one of {NORMS}")
    for name in ("norm_epsilon", "ffn_init_stddev"):
        value = locals()[name]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            _fail(name, value, "None or a positive number")
    if scaled_tied_logits and not tied_embeddings:
        raise ValueError(
            "`scaled_tied_logits` scales the tied output layer: set `tied_embeddings=True` too. "
            f"Received: scaled_tied_logits=True, tied_embeddings={tied_embeddings!r}"
        )
    return {
        "vocabulary_size": vocabulary_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "hidden_dim": hidden_dim,
        "head_dim": head_dim,
        "max_sequence_length": max_sequence_length,
        "position_scale": position_scale,
        "position_mode": position_mode,
        "logit_clip": None if logit_clip is None else float(logit_clip),
        "blocks": per_layer,
        "ffn": ffn,
        "ffn_factor": ffn_factor,
        "position_dim": position_dim,
        "position_embedding": bool(position_embedding),
        "windows": windows,
        "dropout": float(dropout),
        "tied_embeddings": bool(tied_embeddings),
        "norm": norm,
        "norm_epsilon": norm_epsilon,
        "embedding_norm": bool(embedding_norm),
        "final_norm": bool(final_norm),
        "scaled_tied_logits": bool(scaled_tied_logits),
        "ffn_bias": bool(ffn_bias),
        "ffn_init_stddev": ffn_init_stddev,
        "first_value_projection": bool(first_value_projection),
    }


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
