"""Every private Keras, keras-hub and TensorFlow module the package imports, in one place.

A release that moves one of these breaks this module alone. (Private attributes of public
objects, such as a Keras layer's `_convert_input_args`, stay where they are used.)
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


def scale_loss_for_distribution(loss):
    """Keras' own: a replica's loss divided by the replicas of a `tf.distribute` strategy (TensorFlow only)."""
    from keras.src.losses.loss import scale_loss_for_distribution

    return scale_loss_for_distribution(loss)


def unscale_loss_for_distribution(loss):
    """Keras' own: the inverse of `scale_loss_for_distribution`, for the loss a step reports."""
    from keras.src.losses.loss import unscale_loss_for_distribution

    return unscale_loss_for_distribution(loss)


def torch_device():
    """The device Keras' PyTorch backend makes tensors on now: its `device_scope`'s (`"meta"` while it infers
    shapes), else its default."""
    from keras.src.backend.torch.core import get_device

    return get_device()
