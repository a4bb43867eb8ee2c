"""Every private Keras, keras-hub and TensorFlow API the package uses, in one place.

A Keras, keras-hub or TensorFlow release that moves one of these breaks this module alone.
"""

from keras.src.backend.common import global_state  # noqa: F401  (Keras' shared-object map while saving)
from keras.src.backend.common.symbolic_scope import in_symbolic_scope  # noqa: F401  (tracing on KerasTensors)


def in_xla_context(graph):
    """Whether `graph` is traced for XLA (`tf.function(jit_compile=True)`), by TensorFlow's own test; False
    where TensorFlow no longer has it."""
    try:
        from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext
    except ImportError:  # pragma: no cover
        return False
    return GraphOrParentsInXlaContext(graph)
