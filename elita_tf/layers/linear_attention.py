import keras
from keras import ops

from elita_tf.layers.causal_mixer import CausalMixer
from elita_tf.checks import check_choice, check_integer
from elita_tf.layers.checks import input_width
from elita_tf.layers.initializers import clone_initializer
from elita_tf.ops.linear_attention import (
    LINEAR_ATTENTION_CHUNK_SIZE,
    causal_linear_attention,
    causal_linear_attention_step,
    empty_linear_state,
)

FEATURE_MAPS = {
    "elu+1": lambda x: ops.elu(x) + 1.0,
    "relu": ops.relu,
}


@keras.saving.register_keras_serializable(package="elita_tf")
class LinearAttention(CausalMixer):
    """Causal linear attention (Katharopoulos et al. 2020), multi-head.

    Queries, keys and values are projected per head (with biases), keys and
    queries go through a positive feature map `φ` (default `elu(x) + 1`):

        out_i = φ(q_i)ᵀ Σ_{j<=i} φ(k_j) v_jᵀ / (φ(q_i)ᵀ Σ_{j<=i} φ(k_j) + ε)

        row 0: x . . .
        row 1: x x . .      every earlier position, weight φ(q_i)·φ(k_j)
        row 2: x x x .

    then the heads are projected back to the input width. Training runs in
    chunks, O(T) time and memory; decoding keeps `(S [B, H, D, D], z [B, H, D])`.

    Args:
        num_heads: int. Number of heads `H`.
        head_dim: int. Query, key and value width per head `D`.
        feature_map: `"elu+1"` or `"relu"`. Defaults to `"elu+1"`.
        epsilon: float. Added to the denominator. Defaults to `1e-6`.
        chunk_size: int. Positions per chunk of the kernel. Defaults to `64`.
        kernel_initializer: initializer of the four projections. Defaults to
            `"glorot_uniform"`.
        bias_initializer: initializer of their biases. Defaults to `"zeros"`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[B, T, d]`.
        padding_mask: optional bool `[B, T]`, False at padding: padded keys add
            nothing. Defaults to the Keras mask.
        cache: optional dict `{"S", "z"}` from `get_initial_cache` or a previous call.
        training: ignored.

    Returns:
        `outputs [B, T, d]`, or `(outputs, new_cache)` when a cache is passed.

    Example:
    >>> layer = LinearAttention(num_heads=4, head_dim=16)
    >>> tuple(layer(np.zeros([2, 100, 64], "float32")).shape)
    (2, 100, 64)

    References:
        - [Katharopoulos et al., 2020](https://arxiv.org/abs/2006.16236)
    """

    def __init__(
        self,
        num_heads,
        head_dim,
        feature_map="elu+1",
        epsilon=1e-6,
        chunk_size=LINEAR_ATTENTION_CHUNK_SIZE,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_integer("num_heads", num_heads)
        check_integer("head_dim", head_dim)
        check_integer("chunk_size", chunk_size)
        check_choice("feature_map", feature_map, FEATURE_MAPS)
        if not epsilon > 0:
            raise ValueError(f"`epsilon` must be positive. Received: epsilon={epsilon!r}")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.feature_map = feature_map
        self.epsilon = float(epsilon)
        self.chunk_size = chunk_size
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, inputs_shape):
        width = input_width(inputs_shape)

        def dense(name, equation, output_shape, bias_axes):
            layer = keras.layers.EinsumDense(
                equation,
                output_shape=output_shape,
                bias_axes=bias_axes,
                kernel_initializer=clone_initializer(self.kernel_initializer),
                bias_initializer=clone_initializer(self.bias_initializer),
                dtype=self.dtype_policy,
                name=name,
            )
            layer.build(inputs_shape if name != "output" else (None, None, self.num_heads, self.head_dim))
            return layer

        heads = (None, self.num_heads, self.head_dim)
        self.query_dense = dense("query", "btd,dhe->bthe", heads, "he")
        self.key_dense = dense("key", "btd,dhe->bthe", heads, "he")
        self.value_dense = dense("value", "btd,dhe->bthe", heads, "he")
        self.output_dense = dense("output", "bthe,hed->btd", (None, width), "d")
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: width})

    document_starts_with_cache = True

    def mix(self, inputs, padding_mask, cache, training, document_starts=None):
        phi = FEATURE_MAPS[self.feature_map]
        to_heads = lambda t: ops.transpose(t, [0, 2, 1, 3])  # noqa: E731  [B, T, H, D] -> [B, H, T, D]
        q = to_heads(phi(self.query_dense(inputs)))
        k = to_heads(phi(self.key_dense(inputs)))
        v = to_heads(self.value_dense(inputs))
        state = None if cache is None else (cache["S"], cache["z"])
        if cache is not None and inputs.shape[1] == 1:
            step_mask = None if padding_mask is None else padding_mask[:, 0]
            y, state = causal_linear_attention_step(
                state, q[:, :, 0], k[:, :, 0], v[:, :, 0], mask=step_mask, epsilon=self.epsilon
            )
            y = y[:, :, None]
        else:
            y, state = causal_linear_attention(
                q,
                k,
                v,
                mask=padding_mask,
                initial_state=state,
                epsilon=self.epsilon,
                chunk_size=self.chunk_size,
                document_starts=document_starts,
            )
        outputs = self.output_dense(ops.cast(to_heads(y), self.compute_dtype))
        return outputs if cache is None else (outputs, dict(zip(self.cache_names, state)))

    cache_names = ("S", "z")

    def initial_state(self, batch_size, dtype=None):
        """`(S [B, H, D, D], z [B, H, D])`, zeros (float32, or float64 for a float64 layer)."""
        return empty_linear_state(batch_size, self.num_heads, self.head_dim, self.head_dim, dtype or self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "feature_map": self.feature_map,
                "epsilon": self.epsilon,
                "chunk_size": self.chunk_size,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
