"""Pure `keras.ops` functions: stable causal scans, no Keras state, the same code on TensorFlow, JAX and PyTorch.

Each causal scan has a parallel form for training and a one-step form for decoding, both returning
their state; `reference` holds the naive O(T²) definitions the tests check them against. What
`keras.ops` lacks is in `elita_tf.backend`, one module a backend. Each name loads its module on
first use (`elita_tf.lazy`).
"""

from elita_tf.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "banded_attention": "banded_attention",
        "banded_attention_step": "banded_attention_step",
        "causal_linear_attention": "linear_attention",
        "causal_linear_attention_step": "linear_attention",
        "causal_softmax_mean": "causal_softmax_mean",
        "causal_softmax_mean_step": "causal_softmax_mean",
        "chunked_cross_entropy": "cross_entropy",
        "empty_banded_state": "banded_attention",
        "empty_kv_cache": "softmax_attention",
        "empty_linear_state": "linear_attention",
        "empty_softmax_mean_state": "causal_softmax_mean",
        "gated_output_projection": "gated_projection",
        "softmax_attention": "softmax_attention",
        "unscaled_layer_norm": "layer_norm",
        "update_kv_cache": "softmax_attention",
    },
)
