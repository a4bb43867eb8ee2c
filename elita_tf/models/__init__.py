"""The decoder language model as keras-hub classes, and the named architectures it is built from.

Each name loads its module on first use (`elita_tf.lazy`): `ARCHITECTURES` without TensorFlow.
"""

from elita_tf.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "ARCHITECTURES": "architectures",
        "BLOCK_TYPES": "architectures",
        "FFN_TYPES": "architectures",
        "MODEL_SIZES": "architectures",
        "ElitaBackbone": "elita_backbone",
        "architecture_config": "elita_backbone",
        "ElitaCausalLM": "elita_causal_lm",
        "ElitaCausalLMPreprocessor": "elita_causal_lm_preprocessor",
        "ElitaTokenizer": "elita_tokenizer",
    },
)
