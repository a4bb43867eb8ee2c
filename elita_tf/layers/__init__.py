"""Keras layers, one public layer per file: token mixers (`CausalMixer`), feed-forward networks, `DecoderBlock`.

Each name loads its module on first use (`elita_tf.lazy`): `elita_tf.layers.options` without TensorFlow.
"""

from elita_tf.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "AdditiveAttention": "additive_attention",
        "Attention2": "attention2",
        "CausalMixer": "causal_mixer",
        "CausalSelfAttention": "causal_self_attention",
        "DecoderBlock": "decoder_block",
        "FeedForward": "feed_forward",
        "FeedForward2": "feedforward2",
        "LinearAttention": "linear_attention",
        "OuterEpsilonRMSNormalization": "outer_epsilon_rms_normalization",
        "PositionEmbedding": "position_embedding",
        "ShapedAttention": "shaped_attention",
        "ShortConvolution": "short_convolution",
        "TokenEmbedding": "token_embedding",
        "TriLinearAttention": "tri_linear_attention",
        "UnscaledLayerNormalization": "unscaled_layer_norm",
    },
)
