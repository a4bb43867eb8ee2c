"""Decoder language models built from the layers, and their keras-hub classes."""

from elita_tf.models.backbone import ElitaBackbone
from elita_tf.models.causal_lm import ElitaCausalLM
from elita_tf.models.causal_lm_preprocessor import ElitaCausalLMPreprocessor
from elita_tf.models.config import (
    BLOCK_TYPES,
    FFN_TYPES,
    PRESETS,
    DecoderConfig,
    preset,
)
from elita_tf.models.decoder import build_decoder
from elita_tf.models.tokenizer import ElitaTokenizer
