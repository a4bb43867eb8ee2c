import math

import keras
import numpy as np
from keras import ops

from elita_tf.layers.causal_mixer import CausalMixer
from elita_tf.checks import check_integer, check_sequence_length
from elita_tf.layers.options import DEFAULT_SEQUENCE_LENGTH
from elita_tf.layers.checks import input_width
from elita_tf.layers.initializers import clone_initializer
from elita_tf.layers.renamed_arguments import UpgradesRenamedArguments
from elita_tf.ops.banded_attention import BANDED_CHUNK_SIZE, banded_attention, empty_banded_state
from elita_tf.ops.banded_attention_step import banded_attention_step
from elita_tf.ops.utils.dtypes import accumulator_dtype

# Products of the Combiner: kv[b * tt + k] = k_t[k xor b] * att_t[k], b < 16.
COMBINER_REP = 16
# Floor of the mean square in Norm: a zero vector stays zero, with a finite gradient.
_NORM_FLOOR = 1e-30
_LN2 = math.log(2.0)


def _norm(x):
    """`Norm_D(x) = x * sqrt(D) / |x|` over the last axis (RMS 1, no gain); zero stays zero."""
    # A sum over the width, not `ops.mean`: Keras' mean reduces float64 in float32 on JAX and PyTorch.
    mean_square = ops.sum(ops.square(x), axis=-1, keepdims=True) / x.shape[-1]
    floor = ops.cast(_NORM_FLOOR, x.dtype)
    # A select, not `maximum`: at the floor JAX's maximum multiplies rsqrt's derivative there (infinite in
    # float32) by 0, a NaN; a select passes a 0.
    return x * ops.rsqrt(ops.where(mean_square > floor, mean_square, floor))


@keras.saving.register_keras_serializable(package="elita_tf")
class TriLinearAttention(UpgradesRenamedArguments, CausalMixer):
    """The 3Lin layer (Andrey Gulin): bilinear attention and an xor-sparse trilinear Combiner.

    From the residual state `s_t` it computes the update that the model adds
    (`s <- s + layer(s)`), with `Norm_D(v) = v sqrt(D) / |v|`:

        x_t  = Norm_dim(s_t)
        qk_t = Norm_qdim(W_QK x_t)    qv_t = W_QV x_t    (qv not normalised: a learned logit scale)
        k_t  = Norm_tt(W_K x_t)       v_t  = Norm_tt(W_V x_t)
        l_tj = (qk_t·qv_j) / (sqrt(qdim) ln 2) - slope (t - j) + hyper / (t - j)      (bits)
        att_t = Σ_{j∈Span(t)} 2^{l_tj} v_j / (1 + Σ_{j∈Span(t)} 2^{l_tj})
        kv_t[b tt + k] = k_t[k xor b] att_t[k],   b = 0 .. 15
        y_t  = W_C kv_t

    The current position is not attended (it enters through `k_t`); the "1"
    is a null slot of logit 0 and value 0; position 0 (the start token) is
    always seen. A narrow layer sees the `sliding_window_size - 1` previous positions, a
    wide one all of them:

        sliding_window_size = 3, s = start position, x = in the window
        row 0: . . . . .      (att = 0)
        row 1: s . . . .
        row 2: s x . . .
        row 3: s x x . .
        row 4: s . x x .

    Narrow layers run as chunked banded attention, O(T * sliding_window_size) time and
    memory; wide layers as plain masked attention, O(T^2) (bilinear logits
    have no linear-time form). Logits are computed in nats (`l ln 2`), with a
    running maximum that includes the null slot, in float32 whatever the
    compute dtype.

    Decoding keeps `(qv, v)` of the positions still in reach: for a narrow
    layer the start position and the last `sliding_window_size - 1` (a ring buffer), for a
    wide layer a buffer of `max_sequence_length` positions.

    The reference's channel dropout (`chP`, a mask on the state before every
    Norm) is not part of the layer: apply it to the inputs if wanted.

    Args:
        query_dim: int. Width `qdim` of the query projections. Defaults to `128`.
        lowrank_dim: int. Width `tt` of keys and values, a multiple of 16.
            Defaults to `64`.
        sliding_window_size: int >= 2. Positions a narrow layer spans, itself included:
            it attends the `sliding_window_size - 1` before it (and the start position).
            Defaults to `64`.
        slope: float. Distance penalty in bits per position. Defaults to `0.0`.
        hyper: float. Bonus `hyper / distance`, in bits. Defaults to `0.0`.
        wide: bool. Attend every earlier position (`sliding_window_size` is unused).
            Defaults to `False`.
        max_sequence_length: int, at least 2. Positions the decoding cache of a wide layer holds.
            Defaults to `DEFAULT_SEQUENCE_LENGTH` (256), the backbone's.
        chunk_size: int. Queries per chunk of the banded kernel. Defaults to `32`.
        kernel_initializer: initializer of `W_QK`, `W_QV`, `W_K`, `W_V`.
            Defaults to N(0, 1/dim) (`VarianceScaling`, fan-in, untruncated normal).
        combiner_initializer: initializer of `W_C`. Defaults to `"zeros"`, as
            the reference: the layer starts as the identity of the residual stream.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[B, T, dim]`, the residual state.
        padding_mask: optional bool `[B, T]`, False at padding: a padded
            position is seen by no row. Defaults to the Keras mask.
        cache: optional dict from `get_initial_cache` or a previous call
            (`query_values`, `values`, `valid`, `position`): the inputs
            continue the sequence the cache holds.
        document_starts: optional bool `[B, T]`, True where a document starts (packed
            documents, without a cache): each document has its own start
            position and sees nothing of another.
        training: ignored.

    Returns:
        `updates [B, T, dim]`, or `(updates, new_cache)` when a cache is passed.

    Example:
    >>> layer = TriLinearAttention(query_dim=32, lowrank_dim=16, sliding_window_size=8)
    >>> s = keras.random.normal([2, 100, 64])
    >>> s = s + layer(s)
    >>> y, cache = layer(s[:, :99], cache=layer.get_initial_cache(2))
    >>> y_last, cache = layer(s[:, 99:], cache=cache)  # one decoding step

    References:
        - [3Lin, A. Gulin](https://github.com/F0reseer/3Lin), `doc/model.md`,
          `code/gpt/model/gpt_cpu.cpp`.
    """

    def __init__(
        self,
        query_dim=128,
        lowrank_dim=64,
        sliding_window_size=64,
        slope=0.0,
        hyper=0.0,
        wide=False,
        max_sequence_length=DEFAULT_SEQUENCE_LENGTH,
        chunk_size=BANDED_CHUNK_SIZE,
        kernel_initializer=None,
        combiner_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_integer("query_dim", query_dim)
        check_integer("lowrank_dim", lowrank_dim)
        if lowrank_dim % COMBINER_REP:
            raise ValueError(
                f"`lowrank_dim` must be a multiple of {COMBINER_REP} (the Combiner pairs channel k with "
                f"k xor b for b < {COMBINER_REP}). Received: lowrank_dim={lowrank_dim}"
            )
        if isinstance(sliding_window_size, bool) or not isinstance(sliding_window_size, int) or sliding_window_size < 2:
            raise ValueError(
                "`sliding_window_size` must be an integer >= 2: a layer attends the sliding_window_size - 1 "
                f"positions before the current one. Received: sliding_window_size={sliding_window_size!r}"
            )
        check_sequence_length("max_sequence_length", max_sequence_length)
        check_integer("chunk_size", chunk_size)
        for name, value in (("slope", slope), ("hyper", hyper)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"`{name}` must be a finite number. Received: {name}={value!r}")
        if kernel_initializer is None:
            kernel_initializer = keras.initializers.VarianceScaling(
                scale=1.0, mode="fan_in", distribution="untruncated_normal"
            )
        self.query_dim = query_dim
        self.lowrank_dim = lowrank_dim
        self.sliding_window_size = sliding_window_size
        self.slope = float(slope)
        self.hyper = float(hyper)
        self.wide = bool(wide)
        self.max_sequence_length = max_sequence_length
        self.chunk_size = chunk_size
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.combiner_initializer = keras.initializers.get(combiner_initializer)

    @property
    def _attention_window(self):
        return None if self.wide else self.sliding_window_size

    def build(self, inputs_shape):
        width = input_width(inputs_shape)

        # Dense layers, so that Keras' int8 quantization and LoRA cover the projections.
        def dense(name, inputs, units, initializer):
            layer = keras.layers.Dense(
                units,
                use_bias=False,
                kernel_initializer=clone_initializer(initializer),
                name=name,
                dtype=self.dtype_policy,
            )
            layer.build((None, None, inputs))
            return layer

        self.query_key_dense = dense("query_key", width, self.query_dim, self.kernel_initializer)
        self.query_value_dense = dense("query_value", width, self.query_dim, self.kernel_initializer)
        self.key_dense = dense("key", width, self.lowrank_dim, self.kernel_initializer)
        self.value_dense = dense("value", width, self.lowrank_dim, self.kernel_initializer)
        self.combiner_dense = dense("combiner", COMBINER_REP * self.lowrank_dim, width, self.combiner_initializer)
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: width})

    # The documented weights are the projections' kernels.
    @property
    def query_key_kernel(self):
        return self.query_key_dense.kernel

    @property
    def query_value_kernel(self):
        return self.query_value_dense.kernel

    @property
    def key_kernel(self):
        return self.key_dense.kernel

    @property
    def value_kernel(self):
        return self.value_dense.kernel

    @property
    def combiner_kernel(self):
        return self.combiner_dense.kernel

    def _project(self, x, dense):
        """`dense(x)` of `x [B, T, dim]` in the compute dtype, returned in the accumulator dtype."""
        return ops.cast(dense(ops.cast(x, self.compute_dtype)), x.dtype)

    def _attend_args(self):
        return {
            "window": self._attention_window,
            "slope": self.slope * _LN2,
            "hyper": self.hyper * _LN2,
            "scale": 1.0 / math.sqrt(self.query_dim),
        }

    def mix(self, inputs, padding_mask, cache, training, document_starts=None):
        acc = accumulator_dtype(self.compute_dtype)
        x = _norm(ops.cast(inputs, acc))
        qk = _norm(self._project(x, self.query_key_dense))[:, None]  # [B, 1, T, qdim]
        qv = self._project(x, self.query_value_dense)[:, None]
        k = _norm(self._project(x, self.key_dense))  # [B, T, tt]
        v = _norm(self._project(x, self.value_dense))[:, None]

        state = None if cache is None else tuple(cache[name] for name in self.cache_names)
        if cache is not None and inputs.shape[1] == 1:
            step_mask = None if padding_mask is None else padding_mask[:, 0]
            att, state = banded_attention_step(
                state, qk[:, :, 0], qv[:, :, 0], v[:, :, 0], mask=step_mask, **self._attend_args()
            )
            att = att[:, :, None]
        else:
            att, state = banded_attention(
                qk,
                qv,
                v,
                mask=padding_mask,
                initial_state=state,
                document_starts=document_starts,
                chunk_size=self.chunk_size,
                **self._attend_args(),
            )
        att = att[:, 0]  # [B, T, tt]

        # kv[b, k] = k[k xor b] * att[k]: 16 xor-permuted copies of the key.
        xor = np.bitwise_xor(np.arange(COMBINER_REP)[:, None], np.arange(self.lowrank_dim)[None, :])
        kv = ops.take(k, ops.convert_to_tensor(xor.astype("int32")), axis=-1) * att[..., None, :]  # [B, T, 16, tt]
        shape = ops.shape(kv)
        kv = ops.reshape(kv, (shape[0], shape[1], COMBINER_REP * self.lowrank_dim))
        outputs = self.combiner_dense(ops.cast(kv, self.compute_dtype))
        return outputs if cache is None else (outputs, dict(zip(self.cache_names, state)))

    cache_names = ("query_values", "values", "valid", "position")

    def initial_state(self, batch_size, dtype=None):
        """The state before any position.

        Returns:
            `(qv [B, 1, S, qdim], v [B, 1, S, tt], valid [B, S] bool, position [B] int32)`,
            float32 (float64 for a float64 layer). Narrow: `S = sliding_window_size`, slot
            0 the start position, then the last `sliding_window_size - 1` positions. Wide:
            `S = max_sequence_length`, slot `n` position `n`.
        """
        return empty_banded_state(
            batch_size,
            1,
            self.query_dim,
            self.lowrank_dim,
            window=self._attention_window,
            max_sequence_length=self.max_sequence_length,
            dtype=dtype or self.compute_dtype,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "query_dim": self.query_dim,
                "lowrank_dim": self.lowrank_dim,
                "sliding_window_size": self.sliding_window_size,
                "slope": self.slope,
                "hyper": self.hyper,
                "wide": self.wide,
                "max_sequence_length": self.max_sequence_length,
                "chunk_size": self.chunk_size,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "combiner_initializer": keras.initializers.serialize(self.combiner_initializer),
            }
        )
        return config
