"""Pure TensorFlow ops: stable causal scans, no Keras state."""

from elita_tf.ops.causal_mean import (
    DEFAULT_CHUNK_SIZE,
    causal_softmax_mean,
    causal_softmax_mean_step,
    empty_state,
)
