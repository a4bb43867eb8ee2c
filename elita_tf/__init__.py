"""elita-tf: efficient, linear-time transformer building blocks for Keras 3, on TensorFlow, JAX and PyTorch.

The data pipeline (`tf.data`) and the exports (SavedModel, LiteRT) are TensorFlow's on every backend.

The submodules (`elita_tf.layers`, `elita_tf.models`, ...) load on first use (`elita_tf.lazy`).
"""

from elita_tf.lazy import lazy_exports

__version__ = "0.1.0"

_SUBMODULES = ("data", "export", "layers", "models", "ops", "optimizers", "schedules", "training")
__getattr__, __dir__, __all__ = lazy_exports(__name__, {name: name for name in _SUBMODULES})
