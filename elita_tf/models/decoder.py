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
"""

import keras

from elita_tf.layers import (
    AdditiveAttention,
    Attention2,
    FeedForward2,
    LinearAttention,
    SimplifiedBlock,
    TransformerBlock,
    WideFeedForward,
)
from elita_tf.layers.gain import Gain
from elita_tf.layers.position_embedding import PositionEmbedding
from elita_tf.layers.token_embedding import TokenEmbedding
from elita_tf.layers.trilinear import TriLinearAttention, alibi_v1
from elita_tf.models.config import DecoderConfig


def _additive_window(config, index):
    if config.windows is not None:
        return config.windows[index]
    # The reference: 4 * 2^l, the last layer global.
    return None if index == config.num_layers - 1 else 4 * 2**index


def _feedforward(config, index, shared):
    if config.ffn == "feedforward2":
        return FeedForward2(factor=config.ffn_factor, name=f"ffn_{index}")
    if config.ffn == "mlp":
        return WideFeedForward(num_layers=1, activation="gelu", name=f"ffn_{index}")
    if config.ffn == "wide":
        return shared
    return None


def _pre_norm_block(x, attention, ffn, config, index, norm_kwargs):
    drop = lambda name: keras.layers.Dropout(config.dropout, name=name)  # noqa: E731
    norm = keras.layers.LayerNormalization(name=f"attention_norm_{index}", **norm_kwargs)
    x = x + drop(f"attention_dropout_{index}")(attention(norm(x)))
    if ffn is not None:
        norm = keras.layers.LayerNormalization(name=f"ffn_norm_{index}", **norm_kwargs)
        x = x + drop(f"ffn_dropout_{index}")(ffn(norm(x)))
    return x


def build_decoder(config, name=None):
    """A decoder language model for `config` (a `DecoderConfig` or its dict).

    Returns:
        A `keras.Model` mapping int token ids `[B, T]` to float32 logits
        `[B, T, vocab_size]`. Layer names are stable (`block_{i}`,
        `ffn_{i}`, ...) so weights load by name.

    Example:
    >>> from elita_tf.models import preset
    >>> model = build_decoder(preset("elita", vocab_size=100, width=32, num_layers=2))
    >>> model(tf.zeros([2, 16], tf.int32)).shape
    TensorShape([2, 16, 100])
    """
    if isinstance(config, dict):
        config = DecoderConfig.from_config(config)
    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    embedding = TokenEmbedding(config.vocab_size, config.width, tie_weights=config.tied_embeddings, name="embedding")
    x = embedding(tokens)
    if config.position_embedding:
        x = x + PositionEmbedding(config.context_length, name="position_embedding")(x)
    x = keras.layers.Dropout(config.dropout, name="embedding_dropout")(x)

    shared = None
    if config.ffn == "wide":
        shared = WideFeedForward(num_layers=config.num_layers, name="wide_ffn")
    for i, block in enumerate(config.blocks):
        if block == "elita":
            attention = Attention2(
                config.num_heads,
                config.head_dim,
                config.position_dim,
                context_length=config.context_length,
                name=f"block_{i}",
            )
            norm = {"center": False, "scale": False, "epsilon": 1e-3}
            x = _pre_norm_block(x, attention, _feedforward(config, i, shared), config, i, norm)
        elif block == "linear":
            attention = LinearAttention(config.num_heads, config.head_dim, name=f"block_{i}")
            x = _pre_norm_block(x, attention, _feedforward(config, i, shared), config, i, {})
        elif block == "additive":
            attention = AdditiveAttention(
                config.num_heads, window=_additive_window(config, i), dropout=config.dropout, name=f"block_{i}"
            )
            x = _pre_norm_block(x, attention, _feedforward(config, i, shared), config, i, {})
        elif block == "transformer":
            x = TransformerBlock(
                config.num_heads,
                head_dim=config.head_dim,
                dropout=config.dropout,
                max_length=config.context_length,
                name=f"block_{i}",
            )(x)
        elif block == "simplified":
            own_mlp = config.ffn != "wide"
            out = SimplifiedBlock(
                config.num_heads, feedforward=own_mlp, max_length=config.context_length, name=f"block_{i}"
            )(x)
            if not own_mlp:
                normed = keras.layers.RMSNormalization(epsilon=1e-5, name=f"ffn_norm_{i}")(x)
                out = out + Gain(0.1, name=f"ffn_gain_{i}")(shared(normed))
            x = out
        else:  # 3lin
            slope, hyper, wide = alibi_v1(i)
            window = 64 if config.windows is None or config.windows[i] is None else config.windows[i]
            x = x + TriLinearAttention(
                # The reference's proportions (dim 256: qdim 128, tt 64); tt a multiple of 16.
                query_dim=max(16, config.width // 2),
                lowrank_dim=max(16, config.width // 4 // 16 * 16),
                window=window,
                slope=slope,
                hyper=hyper,
                wide=wide,
                max_length=config.context_length,
                name=f"block_{i}",
            )(x)

    x = keras.layers.LayerNormalization(name="final_norm")(x)
    if config.tied_embeddings:
        logits = embedding(x, reverse=True)
    else:
        logits = keras.layers.Dense(config.vocab_size, dtype="float32", name="logits")(x)
    logits = keras.layers.Activation("linear", dtype="float32", name="float32_logits")(logits)
    return keras.Model(tokens, logits, name=name or "decoder")
