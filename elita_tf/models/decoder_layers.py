"""The layer factory: a backbone config to the layers of the decoder, by their stable names.

`make_layers(config, dtype)` gives `token_embedding`, `position_embedding`, `embedding_norm`,
`embedding_dropout`, `block_{i}`, `final_norm` and `logits` as the config asks: each block a
`DecoderBlock(mixer, ffn, norm, residual)` whose mixer and feed-forward network follow its block
type. `ElitaBackbone` runs them; nothing else depends on the block type.
"""

import keras

from elita_tf.layers import (
    AdditiveAttention,
    Attention2,
    CausalSelfAttention,
    DecoderBlock,
    FeedForward,
    FeedForward2,
    LinearAttention,
    PositionEmbedding,
    ShapedAttention,
    ShortConvolution,
    TokenEmbedding,
    TriLinearAttention,
)


def alibi_v1(layer_index):
    """3Lin's "Alibi V1" position terms of attention `layer_index` (period 6).

    `k` even: `hyper = 20 * ((k / 2) mod 3 + 1) / 3` (6.67, 13.3, 20 bits·token);
    `k` odd: `slope = 0.5 * ((k // 2) mod 3) / 2` (0, 0.25, 0.5 bits per
    token); a layer with neither is wide (layers 1, 7, 13, ...).

    Returns:
        `(slope, hyper, wide)`, the `TriLinearAttention` arguments.
    """
    if isinstance(layer_index, bool) or not isinstance(layer_index, int) or layer_index < 0:
        raise ValueError(f"`layer_index` must be a non-negative integer. Received: layer_index={layer_index!r}")
    slope, hyper = 0.0, 0.0
    if layer_index % 2 == 0:
        hyper = 20.0 * ((layer_index // 2) % 3 + 1) / 3.0
    else:
        slope = 0.5 * ((layer_index // 2) % 3) / 2.0
    return slope, hyper, slope == 0.0 and hyper == 0.0


def _sliding_window_size(config, index, default):
    sizes = config["sliding_window_sizes"]
    return default if sizes is None else sizes[index]


def three_lin_dims(width):
    """3Lin's `(query_dim, lowrank_dim)` at `width`: the reference's proportions (256: 128 and 64), the low rank a
    multiple of 16."""
    return max(16, width // 2), max(16, width // 4 // 16 * 16)


def _make_mixer(config, index, dtype):
    block = config["blocks"][index]
    common = {"name": "mixer", "dtype": dtype}
    if block == "elita":
        return Attention2(
            config["num_heads"],
            config["head_dim"],
            config["position_dim"],
            position_scale=config["position_scale"] or config["max_sequence_length"],
            position_mode=config["position_mode"],
            logit_clip=config["logit_clip"],
            **common,
        )
    if block == "linear":
        return LinearAttention(config["num_heads"], config["head_dim"], **common)
    if block == "additive":
        return AdditiveAttention(
            config["num_heads"],
            # The reference's: 4 * 2^l, the last layer global.
            sliding_window_size=_sliding_window_size(
                config, index, None if index == config["num_layers"] - 1 else 4 * 2**index
            ),
            dropout=config["dropout"],
            **common,
        )
    if block == "transformer":
        return CausalSelfAttention(
            config["num_heads"],
            head_dim=config["head_dim"],
            dropout=config["dropout"],
            max_sequence_length=config["max_sequence_length"],
            sliding_window_size=_sliding_window_size(config, index, None),
            **common,
        )
    if block == "simplified":
        value_projection = config["first_value_projection"] and index == config["blocks"].index("simplified")
        return ShapedAttention(
            config["num_heads"],
            value_projection=value_projection,
            max_sequence_length=config["max_sequence_length"],
            **common,
        )
    slope, hyper, wide = alibi_v1(index)
    query_dim, lowrank_dim = three_lin_dims(config["hidden_dim"])
    return TriLinearAttention(
        query_dim=query_dim,
        lowrank_dim=lowrank_dim,
        # 3Lin has no global form: a None entry is its default window too.
        sliding_window_size=_sliding_window_size(config, index, 64) or 64,
        slope=slope,
        hyper=hyper,
        wide=wide,
        max_sequence_length=config["max_sequence_length"],
        **common,
    )


def _make_ffn(config, index, shared_ffn, dtype):
    block = config["blocks"][index]
    if config["ffn"] == "none" or block == "3lin":
        return None
    if config["ffn"] == "wide":
        return shared_ffn
    if config["ffn"] == "feedforward2":
        return FeedForward2(config["intermediate_dim"], factor=config["ffn_factor"], name="ffn", dtype=dtype)
    if block == "simplified":  # the Simplified Transformer's MLP: ReLU, no biases, N(0, 0.02)
        init = keras.initializers.RandomNormal(stddev=0.02)
        return FeedForward(config["intermediate_dim"], use_bias=False, kernel_initializer=init, name="ffn", dtype=dtype)
    stddev = config["ffn_init_stddev"]
    init = "glorot_uniform" if stddev is None else keras.initializers.RandomNormal(stddev=stddev)
    return FeedForward(
        config["intermediate_dim"],
        activation="gelu",
        use_bias=config["ffn_bias"],
        kernel_initializer=init,
        name="ffn",
        dtype=dtype,
    )


# Each block type's norm, epsilon and residual form.
_BLOCK_PARTS = {
    "elita": ("unscaled_layer_norm", 1e-3, "pre_norm"),  # ELiTA's LayerNorm has no scale or centre
    "linear": ("layer_norm", 1e-3, "pre_norm"),
    "additive": ("layer_norm", 1e-3, "pre_norm"),
    "transformer": ("layer_norm", 1e-5, "pre_norm"),
    "simplified": ("rms_norm", 1e-5, "parallel"),
    "3lin": (None, 1e-5, "pre_norm"),  # 3Lin normalises its own input
}


def _make_block(config, index, shared_ffn, dtype):
    norm, epsilon, residual = _BLOCK_PARTS[config["blocks"][index]]
    if norm is not None and config["norm"] is not None:
        norm = config["norm"]
    return DecoderBlock(
        _make_mixer(config, index, dtype),
        _make_ffn(config, index, shared_ffn, dtype),
        norm=norm,
        layer_norm_epsilon=epsilon if config["layer_norm_epsilon"] is None else config["layer_norm_epsilon"],
        residual=residual,
        dropout=config["dropout"],
        short_convolution=None
        if config["short_convolution"] is None
        else ShortConvolution(config["short_convolution"], name="short_convolution", dtype=dtype),
        name=f"block_{index}",
        dtype=dtype,
    )


def make_layers(config, dtype):
    """Every layer of the decoder, by its stable name (`token_embedding`, `block_{i}`, `final_norm`, ...)."""
    epsilon = 1e-3 if config["layer_norm_epsilon"] is None else config["layer_norm_epsilon"]
    layers = {"token_embedding": TokenEmbedding(config["vocabulary_size"], config["hidden_dim"], dtype=dtype)}
    if config["position_embedding"]:
        layers["position_embedding"] = PositionEmbedding(config["max_sequence_length"], dtype=dtype)
    if config["embedding_norm"]:
        layers["embedding_norm"] = keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype)
    layers["embedding_dropout"] = keras.layers.Dropout(config["dropout"], dtype=dtype)
    shared_ffn = None
    if config["ffn"] == "wide":
        shared_ffn = FeedForward(
            config["intermediate_dim"], shared_by=config["num_layers"], name="wide_ffn", dtype=dtype
        )
    for i in range(config["num_layers"]):
        layers[f"block_{i}"] = _make_block(config, i, shared_ffn, dtype)
    if config["final_norm"]:
        layers["final_norm"] = keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype)
    if not config["tie_word_embeddings"]:
        layers["logits"] = keras.layers.Dense(config["vocabulary_size"], dtype=dtype)
    for name, layer in layers.items():
        layer.name = name  # stable names: weights load by name
    return layers
