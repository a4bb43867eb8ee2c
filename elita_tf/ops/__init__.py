"""Pure TensorFlow ops: stable causal scans, no Keras state."""

from elita_tf.ops.banded_attention import (
    banded_attention,
    banded_attention_step,
    empty_banded_state,
)
from elita_tf.ops.causal_mean import (
    DEFAULT_CHUNK_SIZE,
    causal_softmax_mean,
    causal_softmax_mean_step,
    empty_state,
)
from elita_tf.ops.cross_entropy import chunked_cross_entropy
from elita_tf.ops.gated_projection import gated_output_projection
from elita_tf.ops.layer_norm import unscaled_layer_norm
from elita_tf.ops.linear_attention import (
    causal_linear_attention,
    causal_linear_attention_step,
    empty_linear_state,
)
from elita_tf.ops.softmax_attention import (
    empty_kv_cache,
    softmax_attention,
    update_kv_cache,
)
