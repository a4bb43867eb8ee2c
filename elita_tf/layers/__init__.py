"""Keras layers, one public layer per file: token mixers (`CausalMixer`), feed-forward networks, `DecoderBlock`."""

from elita_tf.layers.additive_attention import AdditiveAttention
from elita_tf.layers.attention2 import Attention2
from elita_tf.layers.causal_mixer import CausalMixer
from elita_tf.layers.causal_self_attention import CausalSelfAttention
from elita_tf.layers.decoder_block import DecoderBlock
from elita_tf.layers.feedforward2 import FeedForward2
from elita_tf.layers.linear_attention import LinearAttention
from elita_tf.layers.outer_epsilon_rms_normalization import OuterEpsilonRMSNormalization
from elita_tf.layers.position_embedding import PositionEmbedding
from elita_tf.layers.shaped_attention import ShapedAttention
from elita_tf.layers.token_embedding import TokenEmbedding
from elita_tf.layers.tri_linear_attention import TriLinearAttention
from elita_tf.layers.unscaled_layer_norm import UnscaledLayerNormalization
from elita_tf.layers.wide_feedforward import WideFeedForward

__all__ = [
    "AdditiveAttention",
    "Attention2",
    "CausalMixer",
    "CausalSelfAttention",
    "DecoderBlock",
    "FeedForward2",
    "LinearAttention",
    "OuterEpsilonRMSNormalization",
    "PositionEmbedding",
    "ShapedAttention",
    "TokenEmbedding",
    "TriLinearAttention",
    "UnscaledLayerNormalization",
    "WideFeedForward",
]
