import math

import keras
from keras import ops

from elita_tf.layers.causal_mixer import CausalMixer
from elita_tf.checks import check_dropout, check_integer
from elita_tf.layers.checks import input_width
from elita_tf.layers.initializers import clone_initializer
from elita_tf.layers.renamed_arguments import UpgradesRenamedArguments
from elita_tf.ops.causal_softmax_mean import (
    SOFTMAX_MEAN_CHUNK_SIZE,
    causal_softmax_mean,
    causal_softmax_mean_step,
    empty_softmax_mean_state,
)
from elita_tf.ops.utils.dtypes import accumulator_dtype


@keras.saving.register_keras_serializable(package="elita_tf")
class AdditiveAttention(UpgradesRenamedArguments, CausalMixer):
    """Causal (windowed) multi-head additive attention, as in fastformerLM.

    The attention part of a `FastformerForCausalLM` layer (Fastformer, Wu et
    al. 2021, made causal and windowed by mtanghu's fastformerLM) on an
    already normalised input `u [B, T, d]`. With `H` heads of width
    `e = d / H`, each pooling `AA(z, w)` is a causal softmax-weighted mean of
    `z` whose logits depend on the key position only:

        AA(z, w)_i = Σ_{j∈W(i)} e^{s_j} z_j / Σ_{j∈W(i)} e^{s_j},   s_j = z_j^{(r)}·w^{(r)} / sqrt(e)  (head r)

        q = u W_q        κ = u W_k        v = u W_v
        Q̄ = Dropout(AA(q, w_q)) W_o
        m = LayerNorm(u + Q̄ ⊙ κ)
        K̄ = Dropout(AA(m, w_k))
        outputs = Q̄ ⊙ κ + K̄ ⊙ v

    `W(i)` is every position up to `i` (global) or the last `sliding_window_size` of them:

        sliding_window_size=None     sliding_window_size=3
        row 0: x . . .  x . . . .
        row 1: x x . .  x x . . .
        row 2: x x x .  x x x . .
        row 3: x x x x  . x x x .

    The means are computed by the stable kernel of `elita_tf.ops.causal_softmax_mean`
    (no `cumsum` differences, no overflow for any logit), in O(T) time for
    every window. `w_q` and `w_k` start at zero, so at initialisation every
    pooling is a causal (windowed) arithmetic mean.

    Deviation from the reference: fastformerLM's residual is `u = LN(h)`
    (`h_attn = u + Q̄ ⊙ κ + K̄ ⊙ v`), which discards the un-normalised stream.
    This layer returns only the update `Q̄ ⊙ κ + K̄ ⊙ v`, so that a pre-norm
    block `h + AdditiveAttention(LN(h))` keeps `h`; the mid LayerNorm still
    sees `u + Q̄ ⊙ κ` as in the reference.

    Decoding keeps the state of both poolings: `(logZ, mean)` per head each
    (global), or ring buffers of the last `sliding_window_size` logits and values.

    Args:
        num_heads: int. Number of heads `H`; must divide the input width.
        sliding_window_size: int or None. Positions each row pools over, itself included.
            Defaults to `None` (every earlier position).
        dropout: float in `[0, 1)`. Dropout rate on both pooled vectors. Defaults to `0.0`.
        layer_norm_epsilon: float. Epsilon of the mid LayerNorm. Defaults to
            `1e-5`.
        chunk_size: int. Positions per matrix-product chunk of the kernel.
            Defaults to `32`.
        kernel_initializer: initializer of `W_q`, `W_k`, `W_v`, `W_o` (each
            sublayer gets its own copy). Defaults to
            `RandomNormal(stddev=0.02)`, as the reference.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[B, T, d]`, the normalised stream `u`.
        padding_mask: optional bool `[B, T]`, False at padding. Padded
            positions add nothing to either pooling. Defaults to the Keras mask.
        cache: optional dict from `get_initial_cache` or a previous call:
            the inputs continue the sequence the cache summarises.
        training: bool. Applies dropout when True.

    Returns:
        `outputs [B, T, d]`, or `(outputs, new_cache)` when a cache is passed.

    Example:
    >>> layer = AdditiveAttention(num_heads=4, sliding_window_size=16)
    >>> x = np.random.default_rng(0).normal(size=[2, 100, 64]).astype("float32")
    >>> tuple(layer(x).shape)
    (2, 100, 64)
    >>> y, cache = layer(x[:, :99], cache=layer.get_initial_cache(2))
    >>> y_last, cache = layer(x[:, 99:], cache=cache)  # one decoding step

    References:
        - [Wu et al., 2021](https://arxiv.org/abs/2108.09084)
        - [fastformerLM, mtanghu](https://github.com/mtanghu/LEAP)
    """

    def __init__(
        self,
        num_heads,
        sliding_window_size=None,
        dropout=0.0,
        layer_norm_epsilon=1e-5,
        chunk_size=SOFTMAX_MEAN_CHUNK_SIZE,
        kernel_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_integer("num_heads", num_heads)
        check_integer("sliding_window_size", sliding_window_size, optional=True)
        check_integer("chunk_size", chunk_size)
        check_dropout("dropout", dropout)
        if not layer_norm_epsilon > 0:
            raise ValueError(
                f"`layer_norm_epsilon` must be positive. Received: layer_norm_epsilon={layer_norm_epsilon!r}"
            )
        self.num_heads = num_heads
        self.sliding_window_size = sliding_window_size
        self.dropout = float(dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.chunk_size = chunk_size
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer or keras.initializers.RandomNormal(stddev=0.02)
        )

    def build(self, inputs_shape):
        width = input_width(inputs_shape)
        if width % self.num_heads:
            raise ValueError(
                f"The input width must be divisible by `num_heads`. Received: width={width}, num_heads={self.num_heads}"
            )
        sub = {"dtype": self.dtype_policy}

        def dense(name):
            layer = keras.layers.Dense(
                width,
                use_bias=False,
                kernel_initializer=clone_initializer(self.kernel_initializer),
                name=name,
                **sub,
            )
            layer.build(inputs_shape)
            return layer

        self.query_dense = dense("query")
        self.key_dense = dense("key")
        self.value_dense = dense("value")
        self.output_dense = dense("output")
        self.mid_norm = keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon, name="mid_norm", **sub)
        self.mid_norm.build(inputs_shape)
        self.pooling_dropout = keras.layers.Dropout(self.dropout, name="pooling_dropout", **sub)
        # w_q and w_k of the reference: one logit vector per head, side by side.
        self.query_pooling = self.add_weight(
            name="query_pooling", shape=(width,), initializer="zeros", dtype=self.variable_dtype
        )
        self.key_pooling = self.add_weight(
            name="key_pooling", shape=(width,), initializer="zeros", dtype=self.variable_dtype
        )
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: width})

    def _pool(self, x, pooling, padding_mask, state, step, document_starts=None):
        """`AA(x, w)` of `x [B, T, d]`, in the compute dtype, and the new pooling state."""
        acc = accumulator_dtype(self.compute_dtype)
        width = x.shape[-1]
        head_dim = width // self.num_heads
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        values = ops.reshape(ops.cast(x, acc), [batch, length, self.num_heads, head_dim])
        values = ops.transpose(values, [0, 2, 1, 3])  # [B, H, T, D]
        pooling = ops.reshape(ops.cast(pooling, acc), [self.num_heads, head_dim])
        logits = ops.einsum("bhtd,hd->bht", values, pooling) / math.sqrt(head_dim)  # [B, H, T]
        if step:
            step_mask = None if padding_mask is None else padding_mask[:, 0]
            mean, _, state = causal_softmax_mean_step(
                state, logits[..., 0], values[:, :, 0], window=self.sliding_window_size, mask=step_mask
            )
            mean = mean[:, :, None]
        else:
            mean, _, state = causal_softmax_mean(
                logits,
                values,
                window=self.sliding_window_size,
                mask=padding_mask,
                initial_state=state,
                chunk_size=self.chunk_size,
                document_starts=document_starts,
            )
        mean = ops.reshape(ops.transpose(mean, [0, 2, 1, 3]), [batch, length, width])
        return ops.cast(mean, self.compute_dtype), state

    document_starts_with_cache = True

    def mix(self, inputs, padding_mask, cache, training, document_starts=None):
        step = cache is not None and inputs.shape[1] == 1
        query_state = None if cache is None else tuple(cache[name] for name in self.cache_names[:2])
        key_state = None if cache is None else tuple(cache[name] for name in self.cache_names[2:])

        query = self.query_dense(inputs)
        keys = self.key_dense(inputs)
        values = self.value_dense(inputs)
        pooled_query, query_state = self._pool(
            query, self.query_pooling, padding_mask, query_state, step, document_starts
        )
        pooled_query = self.output_dense(self.pooling_dropout(pooled_query, training=training))
        mixed = pooled_query * keys
        mid = self.mid_norm(inputs + mixed)
        pooled_key, key_state = self._pool(mid, self.key_pooling, padding_mask, key_state, step, document_starts)
        pooled_key = self.pooling_dropout(pooled_key, training=training)
        outputs = mixed + pooled_key * values
        if cache is None:
            return outputs
        return outputs, dict(zip(self.cache_names, (*query_state, *key_state)))

    @property
    def cache_names(self):
        # A global pooling keeps its running normaliser and mean, a windowed one a ring of its last positions.
        parts = ("log_z", "mean") if self.sliding_window_size is None else ("logits", "values")
        return tuple(f"{pooling}_{part}" for pooling in ("query", "key") for part in parts)

    def initial_state(self, batch_size, dtype=None):
        """The state before any position; the layer must be built.

        Returns:
            Four fixed-shape tensors (float32, or float64 for a float64
            layer): the query pooling's state then the key pooling's. Global:
            `(log_z [B, H], mean [B, H, D])` each; windowed: `(logits [B, H,
            W], values [B, H, W, D])` each (`W = sliding_window_size`).
        """
        if not self.built:
            raise ValueError(
                f"Layer '{self.name}' must be built (called once, or `build()`) before "
                f"`get_initial_cache`: its head width depends on the input width. Received: built={self.built}"
            )
        dtype = accumulator_dtype(dtype or self.compute_dtype)
        head_dim = self.query_pooling.shape[0] // self.num_heads
        query_state = empty_softmax_mean_state(batch_size, self.num_heads, head_dim, self.sliding_window_size, dtype)
        key_state = empty_softmax_mean_state(batch_size, self.num_heads, head_dim, self.sliding_window_size, dtype)
        return (*query_state, *key_state)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "sliding_window_size": self.sliding_window_size,
                "dropout": self.dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "chunk_size": self.chunk_size,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
