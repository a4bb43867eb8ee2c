"""Exports of an `ElitaCausalLM`: a SavedModel for serving, a LiteRT file for phones (and its runner).

Each name loads its module on first use (`elita_tf.lazy`): `elita_tf.export.settings` without TensorFlow.
"""

from elita_tf.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "export_litert": "litert",
        "LiteRTModel": "litert_model",
        "export_saved_model": "saved_model",
        "load_saved_model": "saved_model",
    },
)
