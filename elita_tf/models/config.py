"""`DecoderConfig`: everything that defines a decoder language model, and the named presets."""

import dataclasses
import json

BLOCK_TYPES = ("elita", "transformer", "simplified", "linear", "3lin", "additive")
FFN_TYPES = ("feedforward2", "mlp", "wide", "none")
DECODER_POSITION_MODES = ("fixed", "clamped")  # Attention2's modes that decode (not "length")


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """A decoder language model: token ids `[B, T]` -> logits `[B, T, V]`.

    Attributes:
        vocab_size: int. Size of the token vocabulary `V`.
        width: int. Model width `d`.
        num_layers: int. Number of blocks.
        num_heads: int. Heads per attention layer.
        head_dim: int. Width per head (ELiTA values, linear attention, Transformer).
        context_length: int. The positions the finite buffers hold: learned
            position tables, key/value buffers and 3Lin's wide layers
            (`max_sequence_length` in `ElitaBackbone`).
        position_scale: int or None. ELiTA's position scale `L` in
            `u_i = i / (L - 1)`, the training length its sinusoids were fitted
            to. None (the default) uses `context_length`.
        position_mode: str. ELiTA's positions past `L`: `"fixed"` (the
            default, the sinusoids run on at `u_i = i / (L - 1)`) or
            `"clamped"` (every position past `L - 1` reads as `L - 1`, so
            the terms stay in the range trained). See `Attention2`.
        blocks: tuple of str, one block type per layer, each one of
            `BLOCK_TYPES`. A single str is repeated over the layers.
        ffn: str. The feed-forward network of every block but `"3lin"`
            (which has none): `"feedforward2"` (ELiTA), `"mlp"` (4d GELU; in
            `"simplified"` blocks the paper's 4d ReLU MLP without biases),
            `"wide"` (one One Wide FFN of width `4 * d * num_layers` shared by
            every block) or `"none"`.
        ffn_factor: int. `FeedForward2`'s second branch width. Defaults to 8.
        position_dim: int. Sinusoid components of ELiTA's position terms.
        position_embedding: bool. Add learned absolute position embeddings.
        windows: tuple of (int or None) per layer, the windows of `"additive"`
            blocks (and `"3lin"` narrow layers). `None` picks the references'
            defaults: `4 * 2**l` with the last layer global for additive, 64
            for 3Lin.
        dropout: float. Residual dropout.
        tied_embeddings: bool. Output logits use the token embedding matrix.
        norm_epsilon: float or None. Epsilon of every norm in the blocks
            (and of `embedding_norm`). None keeps each recipe's: 1e-3 for
            ELiTA, linear and additive blocks, 1e-5 for the Transformer's and
            the Simplified Transformer's.
        embedding_norm: bool. A LayerNorm over `E + P` before the first
            block, as fastformerLM's. Defaults to `False`.
        final_norm: bool. A LayerNorm after the last block. Defaults to `True`
            (fastformerLM has none).
        scaled_tied_logits: bool. Tied logits divided by `sqrt(width)`, as
            fastformerLM's. Needs `tied_embeddings`. Defaults to `False`.
        ffn_bias: bool. Biases in the `"mlp"` FFN of every block but
            `"simplified"` (whose MLP never has them). Defaults to `True`.
        ffn_init_stddev: float or None. `N(0, σ²)` init of that FFN's
            kernels (GPT-2 style, fastformerLM's 0.02); None is Keras' Glorot.
        first_value_projection: bool. A learned value projection with gains
            in the first `"simplified"` block, as the Simplified Transformer's
            official configuration. Defaults to `False`.
    """

    vocab_size: int
    width: int = 64
    num_layers: int = 6
    num_heads: int = 4
    head_dim: int = 16
    context_length: int = 256
    position_scale: int = None
    position_mode: str = "fixed"
    blocks: tuple = ("elita",)
    ffn: str = "feedforward2"
    ffn_factor: int = 8
    position_dim: int = 16
    position_embedding: bool = False
    windows: tuple = None
    dropout: float = 0.0
    tied_embeddings: bool = False
    norm_epsilon: float = None
    embedding_norm: bool = False
    final_norm: bool = True
    scaled_tied_logits: bool = False
    ffn_bias: bool = True
    ffn_init_stddev: float = None
    first_value_projection: bool = False

    def __post_init__(self):
        for name in ["vocab_size", "width", "num_layers", "num_heads", "head_dim", "ffn_factor", "position_dim"]:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
        if not isinstance(self.context_length, int) or self.context_length < 2:
            raise ValueError(
                f"`context_length` must be an integer >= 2. Received: context_length={self.context_length!r}"
            )
        if self.position_scale is not None and (
            isinstance(self.position_scale, bool) or not isinstance(self.position_scale, int) or self.position_scale < 2
        ):
            raise ValueError(
                f"`position_scale` must be None or an integer >= 2. Received: position_scale={self.position_scale!r}"
            )
        if self.position_mode not in DECODER_POSITION_MODES:
            raise ValueError(
                f"`position_mode` must be one of {DECODER_POSITION_MODES}. Received: position_mode={self.position_mode!r}"
            )
        blocks = (self.blocks,) * self.num_layers if isinstance(self.blocks, str) else tuple(self.blocks)
        if len(blocks) == 1:
            blocks = blocks * self.num_layers
        if len(blocks) != self.num_layers:
            raise ValueError(
                f"`blocks` needs one block type per layer ({self.num_layers}). Received: blocks={self.blocks!r}"
            )
        for block in blocks:
            if block not in BLOCK_TYPES:
                raise ValueError(f"Unknown block type. Expected one of {BLOCK_TYPES}. Received: blocks={self.blocks!r}")
        object.__setattr__(self, "blocks", blocks)
        if self.ffn not in FFN_TYPES:
            raise ValueError(f"`ffn` must be one of {FFN_TYPES}. Received: ffn={self.ffn!r}")
        if self.windows is not None:
            windows = tuple(self.windows)
            if len(windows) != self.num_layers:
                raise ValueError(f"`windows` needs one entry per layer. Received: windows={self.windows!r}")
            object.__setattr__(self, "windows", windows)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={self.dropout!r}")
        for name in ("norm_epsilon", "ffn_init_stddev"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"`{name}` must be None or a positive number. Received: {name}={value!r}")
        if self.scaled_tied_logits and not self.tied_embeddings:
            raise ValueError(
                "`scaled_tied_logits` scales the tied output layer: set `tied_embeddings=True` too. "
                f"Received: scaled_tied_logits=True, tied_embeddings={self.tied_embeddings!r}"
            )

    @property
    def decode_limit(self):
        """The positions generation can reach: `context_length` where something is sized by it, else None.

        Key/value buffers (`"transformer"`, `"simplified"`), 3Lin's wide
        layers and learned position tables hold `context_length` positions.
        ELiTA, linear and additive blocks carry constant-size states, and
        ELiTA's sinusoidal positions continue past it: with no learned
        positions, such a model decodes with no length limit.
        """
        finite = self.position_embedding or any(b in ("transformer", "simplified", "3lin") for b in self.blocks)
        return self.context_length if finite else None

    def get_config(self):
        config = dataclasses.asdict(self)
        config["blocks"] = list(self.blocks)
        config["windows"] = None if self.windows is None else list(self.windows)
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def to_json(self):
        return json.dumps(self.get_config(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text):
        return cls.from_config(json.loads(text))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


# Every preset keeps width, layers and heads equal, so comparisons are like for like.
PRESETS = {
    "elita": {"blocks": "elita", "ffn": "feedforward2"},
    "transformer": {"blocks": "transformer", "ffn": "mlp", "position_embedding": True},
    "simplified": {"blocks": "simplified", "ffn": "mlp", "position_embedding": True},
    "simplified-wide": {"blocks": "simplified", "ffn": "wide", "position_embedding": True},
    "linear": {"blocks": "linear", "ffn": "mlp", "position_embedding": True},
    "3lin": {"blocks": "3lin", "ffn": "none"},
    "additive": {"blocks": "additive", "ffn": "mlp", "position_embedding": True},
    # The model wrappers of the originals, where ours depart from them (docs/differences.md).
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
    "simplified-reference": {
        "blocks": "simplified",
        "ffn": "mlp",
        "position_embedding": True,
        "tied_embeddings": True,
        "first_value_projection": True,
    },
}


def preset(name, vocab_size, **overrides):
    """The `DecoderConfig` of a named preset (see `PRESETS`), with overrides.

    Example:
    >>> preset("elita", vocab_size=5000, num_layers=4).blocks
    ('elita', 'elita', 'elita', 'elita')
    """
    if name not in PRESETS:
        raise ValueError(f"Unknown preset. Expected one of {sorted(PRESETS)}. Received: name={name!r}")
    return DecoderConfig(vocab_size=vocab_size, **{**PRESETS[name], **overrides})
