"""Decoder language models built from the layers."""

from elita_tf.models.config import BLOCK_TYPES, FFN_TYPES, PRESETS, DecoderConfig, preset
from elita_tf.models.decoder import build_decoder
