"""Pure `keras.ops` functions: stable causal scans, no Keras state, the same code on TensorFlow, JAX and PyTorch.

Each causal scan has a parallel form for training and a one-step form for decoding, both returning
their state; `reference` holds the naive O(T²) definitions the tests check them against. What
`keras.ops` lacks is in `elita_tf.backend`, one module a backend.
"""

from elita_tf.ops.banded_attention import banded_attention, empty_banded_state
from elita_tf.ops.banded_attention_step import banded_attention_step
from elita_tf.ops.causal_softmax_mean import (
    causal_softmax_mean,
    causal_softmax_mean_step,
    empty_softmax_mean_state,
)
from elita_tf.ops.cross_entropy import chunked_cross_entropy
from elita_tf.ops.gated_projection import gated_output_projection
from elita_tf.ops.layer_norm import unscaled_layer_norm
from elita_tf.ops.linear_attention import causal_linear_attention, causal_linear_attention_step, empty_linear_state
from elita_tf.ops.softmax_attention import empty_kv_cache, softmax_attention, update_kv_cache
from elita_tf.renames import renamed_attribute


__all__ = [
    "banded_attention",
    "banded_attention_step",
    "causal_linear_attention",
    "causal_linear_attention_step",
    "causal_softmax_mean",
    "causal_softmax_mean_step",
    "chunked_cross_entropy",
    "empty_banded_state",
    "empty_kv_cache",
    "empty_linear_state",
    "empty_softmax_mean_state",
    "gated_output_projection",
    "softmax_attention",
    "unscaled_layer_norm",
    "update_kv_cache",
]


def __getattr__(name):  # an op's old name is today's, with a warning
    return renamed_attribute(__name__, name)
