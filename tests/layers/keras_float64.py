"""Where Keras itself computes a float64 layer in float32, so that a float64 check cannot be tighter than float32.

Off TensorFlow, Keras' type promotion turns float64 into float32 (`BIT64_TO_BIT32_DTYPE` in
`keras/src/backend/common/dtypes.py`): on PyTorch `ops.matmul` of two float64 tensors, so every
`Dense`, returns float32; on JAX and PyTorch `ops.mean` reduces float64 in float32 (Keras'
`LayerNormalization` and `RMSNormalization`); on JAX `MultiHeadAttention` takes its softmax through
`jax.nn.dot_product_attention`, in float32. The layers' own code keeps float64 (it avoids those
ops); the checks of a layer built on such a Keras part hold its float64 tolerance on the other
backends and float32's round-off on these.
"""

from tests.backend_utils import BACKEND

FLOAT32_ROUND_OFF = 1e-5
DENSE = ("jax", "torch")  # keras.layers.Dense (ops.matmul; on JAX too, in x64 mode)
NORMS = ("jax", "torch")  # keras.layers.LayerNormalization, RMSNormalization (ops.mean)
MULTI_HEAD_ATTENTION = ("jax", "torch")  # keras.layers.MultiHeadAttention


def float64_tolerance(tolerance, *keras_parts, float32=FLOAT32_ROUND_OFF):
    """`tolerance`, or `float32` (round-off) where one of `keras_parts` (tuples of backends) computes in float32."""
    return float32 if any(BACKEND in backends for backends in keras_parts) else tolerance
