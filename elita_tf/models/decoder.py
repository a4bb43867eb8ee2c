"""`build_decoder`: a functional-API decoder language model from a `DecoderConfig`.

    token ids [B, T] -> embedding (+ learned positions) -> blocks -> final norm -> logits [B, T, V]

Blocks (pre-norm residual unless said otherwise):
    elita        x += Attention2(LN(x));         x += FFN(LN(x))    (LN without scale/centre, as the reference)
    linear       x += LinearAttention(LN(x));    x += FFN(LN(x))
    additive     x += AdditiveAttention(LN(x));  x += FFN(LN(x))
    transformer  TransformerBlock (its own norms and 4d GELU FFN)
    simplified   SimplifiedBlock SAS-P, skip-less; with ffn="wide" its MLP is the shared
                 One Wide FFN: x = Block(x) + Gain(WideFFN(RMSNorm(x)))
    3lin         x += TriLinearAttention(x)      (normalises its input itself)

One function, `decoder_forward`, composes the layers: on a `keras.Input` it
builds the functional model; on token ids with caches it is the decoding step
(`elita_tf.generation`), so training and decoding can never disagree on the
architecture.
"""

import keras
from keras.src.backend.common.symbolic_scope import in_symbolic_scope

from elita_tf.layers import (
    AdditiveAttention,
    Attention2,
    FeedForward2,
    Gain,
    LinearAttention,
    PositionEmbedding,
    SimplifiedBlock,
    TokenEmbedding,
    TransformerBlock,
    TriLinearAttention,
    WideFeedForward,
)
from elita_tf.layers.checks import check_integer_ids
from elita_tf.layers.trilinear import alibi_v1
from elita_tf.models.config import DecoderConfig

# Blocks made of an attention layer and an optional FFN, each pre-normed with a residual.
PRE_NORM_BLOCKS = ("elita", "linear", "additive")


def _additive_window(config, index):
    if config.windows is not None:
        return config.windows[index]
    # The reference: 4 * 2^l, the last layer global.
    return None if index == config.num_layers - 1 else 4 * 2**index


def make_layers(config):
    """Every layer of the decoder, by its stable name (`block_{i}`, `ffn_{i}`, ...)."""
    layers = {"embedding": TokenEmbedding(config.vocab_size, config.width, tie_weights=config.tied_embeddings)}
    if config.position_embedding:
        layers["position_embedding"] = PositionEmbedding(config.context_length)
    layers["embedding_dropout"] = keras.layers.Dropout(config.dropout)
    if config.ffn == "wide":
        layers["wide_ffn"] = WideFeedForward(num_layers=config.num_layers)

    for i, block in enumerate(config.blocks):
        if block == "elita":
            layers[f"block_{i}"] = Attention2(
                config.num_heads,
                config.head_dim,
                config.position_dim,
                context_length=config.position_scale or config.context_length,
            )
        elif block == "linear":
            layers[f"block_{i}"] = LinearAttention(config.num_heads, config.head_dim)
        elif block == "additive":
            layers[f"block_{i}"] = AdditiveAttention(
                config.num_heads, window=_additive_window(config, i), dropout=config.dropout
            )
        elif block == "transformer":
            layers[f"block_{i}"] = TransformerBlock(
                config.num_heads, head_dim=config.head_dim, dropout=config.dropout, max_length=config.context_length
            )
        elif block == "simplified":
            layers[f"block_{i}"] = SimplifiedBlock(
                config.num_heads, feedforward=config.ffn != "wide", max_length=config.context_length
            )
            if config.ffn == "wide":
                layers[f"ffn_norm_{i}"] = keras.layers.RMSNormalization(epsilon=1e-5)
                layers[f"ffn_gain_{i}"] = Gain(0.1)
        else:  # 3lin
            slope, hyper, wide = alibi_v1(i)
            window = 64 if config.windows is None or config.windows[i] is None else config.windows[i]
            layers[f"block_{i}"] = TriLinearAttention(
                # The reference's proportions (dim 256: qdim 128, tt 64); tt a multiple of 16.
                query_dim=max(16, config.width // 2),
                lowrank_dim=max(16, config.width // 4 // 16 * 16),
                window=window,
                slope=slope,
                hyper=hyper,
                wide=wide,
                max_length=config.context_length,
            )

        if block in PRE_NORM_BLOCKS:
            norm = {"center": False, "scale": False, "epsilon": 1e-3} if block == "elita" else {}
            layers[f"attention_norm_{i}"] = keras.layers.LayerNormalization(**norm)
            layers[f"attention_dropout_{i}"] = keras.layers.Dropout(config.dropout)
            if config.ffn != "none":
                layers[f"ffn_norm_{i}"] = keras.layers.LayerNormalization(**norm)
                layers[f"ffn_dropout_{i}"] = keras.layers.Dropout(config.dropout)
                if config.ffn == "feedforward2":
                    layers[f"ffn_{i}"] = FeedForward2(factor=config.ffn_factor)
                elif config.ffn == "mlp":
                    layers[f"ffn_{i}"] = WideFeedForward(num_layers=1, activation="gelu")

    layers["final_norm"] = keras.layers.LayerNormalization()
    if not config.tied_embeddings:
        layers["logits"] = keras.layers.Dense(config.vocab_size, dtype="float32")
    for name, layer in layers.items():
        layer.name = name  # stable names: weights load by name, decoding finds layers by name
    return layers


def decoder_forward(config, layers, tokens, padding_mask=None, caches=None, start_index=None, training=None, head=True):
    """The decoder on token ids, from `make_layers` (or a built model's layers by name).

    Args:
        config: `DecoderConfig`.
        layers: mapping from layer name to layer.
        tokens: int `[B, T]` token ids (a `keras.Input` to build a model).
        padding_mask: optional bool `[B, T]`, False at padding.
        caches: optional list, one cache per block (`get_initial_cache`): decode.
        start_index: optional int `[B]`, the position of `tokens[:, 0]` (decoding).
        training: bool.
        head: bool. False returns the final hidden states `[B, T, d]` in place of the logits.

    Returns:
        float32 logits `[B, T, V]`, or `(logits, new_caches)` with caches.
    """
    kwargs = {} if padding_mask is None else {"padding_mask": padding_mask}
    new_caches = []

    def run(block_index, x):
        layer = layers[f"block_{block_index}"]
        if caches is None:
            return layer(x, training=training, **kwargs)
        y, cache = layer(x, cache=caches[block_index], training=training, **kwargs)
        new_caches.append(cache)
        return y

    x = layers["embedding"](tokens)
    if config.position_embedding:
        x = x + layers["position_embedding"](x, start_index=start_index)
    x = layers["embedding_dropout"](x, training=training)
    for i, block in enumerate(config.blocks):
        if block in PRE_NORM_BLOCKS:
            attended = run(i, layers[f"attention_norm_{i}"](x))
            x = x + layers[f"attention_dropout_{i}"](attended, training=training)
            if config.ffn != "none":
                ffn = layers["wide_ffn"] if config.ffn == "wide" else layers[f"ffn_{i}"]
                x = x + layers[f"ffn_dropout_{i}"](ffn(layers[f"ffn_norm_{i}"](x)), training=training)
        elif block == "simplified" and config.ffn == "wide":
            shared = layers["wide_ffn"](layers[f"ffn_norm_{i}"](x))
            x = run(i, x) + layers[f"ffn_gain_{i}"](shared)
        elif block == "3lin":
            x = x + run(i, x)
        else:  # transformer, simplified: blocks with their own residuals
            x = run(i, x)

    x = layers["final_norm"](x)
    if not head:
        return x if caches is None else (x, new_caches)
    logits = decoder_head(config, layers, x)
    return logits if caches is None else (logits, new_caches)


def decoder_head(config, layers, hidden):
    """Float32 logits `[B, T, V]` from the final hidden states `[B, T, d]`."""
    logits = layers["embedding"](hidden, reverse=True) if config.tied_embeddings else layers["logits"](hidden)
    return keras.ops.cast(logits, "float32")


@keras.saving.register_keras_serializable(package="elita_tf")
class DecoderModel(keras.Model):
    """The functional decoder, refusing float token ids before Keras would cast them to int32.

    A functional model converts its inputs to the `keras.Input` dtype, so
    `[[1.5, 2.0]]` would silently become `[[1, 2]]`; here it is a `TypeError`.
    Ids out of range are refused by the embedding (`check_token_ids`).
    """

    def call(self, inputs, training=None, mask=None):
        # Keras traces with placeholders of guessed dtypes (float64 under a distribution strategy)
        # to build losses and metrics: only real inputs are checked.
        if not in_symbolic_scope():
            check_integer_ids(inputs, self.get_layer("embedding").input_dim)
        return super().call(inputs, training=training, mask=mask)


def build_decoder(config, name=None):
    """A decoder language model for `config` (a `DecoderConfig` or its dict).

    Returns:
        A `keras.Model` mapping int token ids `[B, T]` to float32 logits
        `[B, T, vocab_size]`. Layer names are stable (`block_{i}`,
        `ffn_{i}`, ...) so weights load by name and decoding finds them.

    Example:
    >>> from elita_tf.models import preset
    >>> model = build_decoder(preset("elita", vocab_size=100, width=32, num_layers=2))
    >>> model(tf.zeros([2, 16], tf.int32)).shape
    TensorShape([2, 16, 100])
    """
    if isinstance(config, dict):
        config = DecoderConfig.from_config(config)
    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    logits = decoder_forward(config, make_layers(config), tokens)
    return DecoderModel(tokens, logits, name=name or "decoder")
