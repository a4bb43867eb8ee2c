"""The decoder language model as keras-hub classes, and the named architectures it is built from."""

from elita_tf.models.architectures import ARCHITECTURES, BLOCK_TYPES, FFN_TYPES
from elita_tf.models.elita_backbone import ElitaBackbone, architecture_config
from elita_tf.models.elita_causal_lm import ElitaCausalLM
from elita_tf.models.elita_causal_lm_preprocessor import ElitaCausalLMPreprocessor
from elita_tf.models.elita_tokenizer import ElitaTokenizer
