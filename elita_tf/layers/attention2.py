import keras
from keras import ops

from elita_tf import backend

from elita_tf.layers.causal_mixer import CausalMixer
from elita_tf.checks import check_choice, check_integer, check_positive_number, check_sequence_length
from elita_tf.layers.checks import input_width
from elita_tf.layers.initializers import clone_initializer
from elita_tf.layers.options import DEFAULT_SEQUENCE_LENGTH, POSITION_MODES
from elita_tf.ops.causal_softmax_mean import (
    SOFTMAX_MEAN_CHUNK_SIZE,
    causal_softmax_mean,
    causal_softmax_mean_step,
    empty_softmax_mean_state,
)
from elita_tf.ops.gated_projection import gate_and_mix, gated_output_projection
from elita_tf.ops.utils.documents import document_positions, position_after
from elita_tf.ops.utils.dtypes import accumulator_dtype
from elita_tf.ops.utils.positions import real_extent


def _head_major(values):
    """Time-major values `[B, T, H, D]` as the kernel's head-major `[B, H, T, D]`, laid out so in memory.

    Where a transpose is a view of its input (PyTorch), the kernel's `[B * H, T, D]` rows would copy it, and
    the backward pass keep both that copy and the view's `[B, T, H, D]` (for the gate): the reshape makes the one
    copy that both share. Elsewhere a transpose is that copy already, and the reshapes cost nothing.
    """
    batch, length, heads, depth = ops.shape(values)
    rows = ops.reshape(ops.transpose(values, [0, 2, 1, 3]), [batch * heads, length, depth])  # no -1: T may be 0
    return ops.reshape(rows, [batch, heads, length, depth])


@keras.saving.register_keras_serializable(package="elita_tf")
class Attention2(CausalMixer):
    """ELiTA efficient time-linear attention (`Attention2`), causal.

    Per head `h`, with learned sinusoidal position terms
    `P1_i = Σ_r c_r sin(a1_r u_i + b1_r)` and `P2_i = Σ_r c_r sin(a2_r u_i + b2_r)`:

        κ_i = k1·x_i + P1_i      δ_i = k2·x_i      ρ_i = P2_i + k3·x_i      v_i = Vᵀ x_i
        y_i = (e^{δ_i} v_i + e^{ρ_i} Σ_{j<=i} e^{κ_j} v_j) / (e^{δ_i} + e^{ρ_i} Σ_{j<=i} e^{κ_j})
        out_i = Σ_h O_h y_{h,i}

    Row `i` is a softmax over a self slot and every earlier position, whose
    logits are additive in query and key; it is computed exactly, in O(T), as
    a gate between `v_i` and a stable causal softmax mean of the values:

        h̄_i = Σ_{j<=i} e^{κ_j} v_j / Σ_{j<=i} e^{κ_j},  logZ_i = log Σ_{j<=i} e^{κ_j}
        y_i = g_i v_i + (1 - g_i) h̄_i,  g_i = sigmoid(δ_i - ρ_i - logZ_i)

        row 0: s x . .     s = self slot, x = positions averaged into h̄
        row 1: s x x .
        row 2: s x x x

    Decoding keeps `(logZ, h̄)` per head: a constant-size state.

    Args:
        num_heads: int. Number of heads `H`.
        head_dim: int. Value width per head `D`.
        position_dim: int. Number of sinusoid components `p` of the position terms.
        position_scale: int. Training length `L`: in `"fixed"` mode position
            `i` is `u_i = i / (L - 1)`, the reference's `linspace(0, 1, L)`;
            longer sequences extrapolate. Defaults to `DEFAULT_SEQUENCE_LENGTH` (256).
        position_mode: `"fixed"` (`u_i = i / (L - 1)`, consistent for
            decoding and any length; past `L` the sinusoids run on into
            phases never trained), `"clamped"` (the same up to `L - 1`, and
            every later position reads as position `L - 1`: the terms stay in
            their trained range at any length) or `"length"` (the reference
            exactly: `u_i = time_scale * i / (T - 1)`, so every position moves
            with the sequence length; no decoding). Defaults to `"fixed"`.
        time_scale: float. The reference's `t`, used in `"length"` mode.
            Defaults to `1.0`.
        logit_clip: float or None. Clip `κ`, `δ`, `ρ` to `±logit_clip` as the
            reference did with `20.0` (its saturated logits have zero
            gradient). Defaults to `None`: exact for any logit.
        chunk_size: int. Positions per matrix-product chunk of the kernel.
            Defaults to `32`.
        logit_initializer: initializer for `k1`, `k2`, `k3`. Defaults to
            `"random_uniform"` (U(-0.05, 0.05), as the reference).
        position_initializer: initializer for `a1`, `a2`, `b1`, `b2`, `c`.
            Defaults to `"random_uniform"`.
        kernel_initializer: initializer for `value_kernel`, `output_kernel`.
            Defaults to `"glorot_uniform"`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[B, T, d]`.
        padding_mask: optional bool `[B, T]`, False at padding. Padded
            positions add nothing to later rows. Defaults to the Keras mask.
        cache: optional dict from `get_initial_cache` or a previous call
            (`log_z`, `mean`, `position`): the inputs continue the sequence
            the cache summarises.
        training: ignored.

    Returns:
        `outputs [B, T, d]`, or `(outputs, new_cache)` when a cache is passed.

    Example:
    >>> layer = Attention2(num_heads=4, head_dim=16, position_dim=8)
    >>> x = np.random.default_rng(0).normal(size=[2, 100, 64]).astype("float32")
    >>> tuple(layer(x).shape)
    (2, 100, 64)
    >>> y, cache = layer(x[:, :99], cache=layer.get_initial_cache(2))
    >>> y_last, cache = layer(x[:, 99:], cache=cache)  # one decoding step

    References:
        - [ELiTA, A. C. O. Sharma](https://github.com/acosharma/elita-transformer)
    """

    def __init__(
        self,
        num_heads,
        head_dim,
        position_dim,
        position_scale=DEFAULT_SEQUENCE_LENGTH,
        position_mode="fixed",
        time_scale=1.0,
        logit_clip=None,
        chunk_size=SOFTMAX_MEAN_CHUNK_SIZE,
        logit_initializer="random_uniform",
        position_initializer="random_uniform",
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_integer("num_heads", num_heads)
        check_integer("head_dim", head_dim)
        check_integer("position_dim", position_dim)
        check_integer("chunk_size", chunk_size)
        check_choice("position_mode", position_mode, POSITION_MODES)
        check_sequence_length("position_scale", position_scale)
        check_positive_number("logit_clip", logit_clip, optional=True)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.position_dim = position_dim
        self.position_scale = position_scale
        self.position_mode = position_mode
        self.time_scale = float(time_scale)
        self.logit_clip = None if logit_clip is None else float(logit_clip)
        self.chunk_size = chunk_size
        self.logit_initializer = keras.initializers.get(logit_initializer)
        self.position_initializer = keras.initializers.get(position_initializer)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, inputs_shape):
        width = input_width(inputs_shape)
        h, p, d = self.num_heads, self.position_dim, self.head_dim

        def weight(name, shape, initializer):
            return self.add_weight(
                name=name, shape=shape, initializer=clone_initializer(initializer), dtype=self.variable_dtype
            )

        self.a1 = weight("a1", (h, p), self.position_initializer)
        self.a2 = weight("a2", (h, p), self.position_initializer)
        self.b1 = weight("b1", (h, p), self.position_initializer)
        self.b2 = weight("b2", (h, p), self.position_initializer)
        self.c = weight("c", (h, p), self.position_initializer)

        # The projections are EinsumDense layers, so that Keras' int8 quantization and LoRA cover them.
        def projection(name, equation, output_shape, inputs, initializer):
            layer = keras.layers.EinsumDense(
                equation,
                output_shape=output_shape,
                kernel_initializer=clone_initializer(initializer),
                name=name,
                dtype=self.dtype_policy,
            )
            layer.build(inputs)
            return layer

        sequence = (None, None, width)
        self.k1_dense, self.k2_dense, self.k3_dense = (
            projection(name, "btd,hd->bht", (h, None), sequence, self.logit_initializer) for name in ("k1", "k2", "k3")
        )
        # Time-major `[B, T, H, D]` on the projections' side and a transpose to and from the kernel's
        # head-major `[B, H, T, D]`: their gradients are then plain matrix products (a head-major
        # einsum's gradients take several times as long on a CPU).
        self.value_dense = projection("value", "btd,hde->bthe", (None, h, d), sequence, self.kernel_initializer)
        self.output_dense = projection(
            "output", "bthe,hde->btd", (None, width), (None, None, h, d), self.kernel_initializer
        )
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: width})

    # The documented weights, `[H, d]` and `[H, d, D]`, are the projections' kernels.
    @property
    def k1(self):
        return self.k1_dense.kernel

    @property
    def k2(self):
        return self.k2_dense.kernel

    @property
    def k3(self):
        return self.k3_dense.kernel

    @property
    def value_kernel(self):
        return self.value_dense.kernel

    @property
    def output_kernel(self):
        return self.output_dense.kernel

    def _position_index(self, length, start, document_starts):
        """int32 `[B or 1, T]`: each position's index, from `start`, restarting at 0 where a document starts."""
        if document_starts is not None and self.position_mode == "length":
            raise ValueError(
                "Documents restarting inside a sequence need positions that do not move with the length: "
                f"use position_mode='fixed' or 'clamped'. Received: position_mode={self.position_mode!r}"
            )
        return document_positions(length, start, document_starts)

    def _positions(self, index, length):
        """`u [B or 1, T]` in the accumulator dtype, from the position index."""
        dtype = accumulator_dtype(self.compute_dtype)
        if self.position_mode == "clamped":
            index = ops.minimum(index, self.position_scale - 1)
        index = ops.cast(index, dtype)
        if self.position_mode != "length":
            return index / (self.position_scale - 1)
        denominator = ops.cast(ops.maximum(length - 1, 1), dtype)
        return self.time_scale * index / denominator

    def _position_terms(self, u):
        """`(P1, P2)`, each `[B or 1, H, T]`: both sinusoid sums in one pass.

        The phases `a u + b` of both sums are one matrix product of the `[2, H, p, 2]` frequencies and
        offsets with the `[B or 1, 2, T]` basis `(u, 1)`, so that their gradient is one product too, not two
        reductions over time.
        """
        dtype = u.dtype
        weights = [[ops.cast(w, dtype) for w in pair] for pair in ((self.a1, self.b1), (self.a2, self.b2))]
        frequencies_and_offsets = ops.stack([ops.stack(pair, axis=-1) for pair in weights])  # [2, H, p, 2]
        basis = ops.stack([u, ops.ones_like(u)], axis=1)  # [B, 2, T]
        phase = ops.einsum("shpk,bkt->sbhpt", frequencies_and_offsets, basis)  # [2, B, H, p, T]
        p1, p2 = ops.unstack(ops.einsum("hp,sbhpt->sbht", ops.cast(self.c, dtype), ops.sin(phase)), num=2)
        return p1, p2

    def _project(self, inputs):
        """`(kappa, delta, rho, values)`: the three logit projections and the values, as one matrix product.

        Under XLA or on a GPU, one product of the inputs with the four kernels side by side, not four:
        its gradients are two products, not eight, and the layer a few kernels shorter. Each kernel is
        its layer's own (`kernel` includes a LoRA update).
        """
        acc = accumulator_dtype(self.compute_dtype)
        layers = (self.k1_dense, self.k2_dense, self.k3_dense, self.value_dense)
        # On a CPU without XLA four products cost less than gathering the kernels for one; int8 layers
        # take their own calls, which dequantize.
        if not backend.compiled_or_on_gpu() or any(layer.quantization_mode is not None for layer in layers):
            logits = (ops.cast(layer(inputs), acc) for layer in layers[:3])
            return (*logits, _head_major(self.value_dense(inputs)))
        heads, width, depth = self.value_dense.kernel.shape
        # The kernels stacked as rows, `[3H + H D, d]`: the logit kernels `[H, d]` as they are, so that neither
        # they nor their gradients need a transposed copy.
        kernel = ops.concatenate(
            [layer.kernel for layer in layers[:3]]
            + [ops.reshape(ops.transpose(self.value_dense.kernel, [0, 2, 1]), [heads * depth, width])],
            axis=0,
        )
        projected = backend.matmul(
            ops.reshape(inputs, [-1, width]), ops.cast(kernel, self.compute_dtype), transpose_b=True
        )
        shape = ops.shape(inputs)
        logits = ops.reshape(projected[:, : 3 * heads], [shape[0], shape[1], 3, heads])
        kappa, delta, rho = ops.unstack(ops.cast(ops.transpose(logits, [2, 0, 3, 1]), acc), num=3)  # [B, H, T] each
        values = ops.reshape(projected[:, 3 * heads :], [shape[0], shape[1], heads, depth])
        return kappa, delta, rho, _head_major(values)

    document_starts_with_cache = True

    def mix(self, inputs, padding_mask, cache, training, document_starts=None):
        if cache is not None and self.position_mode == "length":
            raise ValueError(
                "Decoding with a cache needs positions that do not move with the length: "
                f"use position_mode='fixed' or 'clamped'. Received: position_mode={self.position_mode!r}"
            )
        length = ops.shape(inputs)[1]
        start = None if cache is None else cache["position"]
        index = self._position_index(length, start, document_starts)
        p1, p2 = self._position_terms(self._positions(index, length))

        acc = p1.dtype
        kappa, delta, rho, values = self._project(inputs)  # [B, H, T] (accumulator dtype) each, [B, H, T, D]
        kappa, rho = kappa + p1, rho + p2
        if self.logit_clip is not None:
            kappa, delta, rho = (ops.clip(z, -self.logit_clip, self.logit_clip) for z in (kappa, delta, rho))

        state = None if cache is None else (cache["log_z"], cache["mean"])
        if cache is not None and inputs.shape[1] == 1:
            step_mask = None if padding_mask is None else padding_mask[:, 0]
            mean, log_z, state = causal_softmax_mean_step(state, kappa[..., 0], values[:, :, 0], mask=step_mask)
            mean, log_z = mean[:, :, None], log_z[..., None]
        else:
            mean, log_z, state = causal_softmax_mean(
                kappa,
                values,
                mask=padding_mask,
                initial_state=state,
                chunk_size=self.chunk_size,
                document_starts=document_starts,
            )
        values, gate_logits = ops.cast(values, acc), delta - rho - log_z
        if self.output_dense.quantization_mode is None:
            # `kernel` includes a LoRA update; the fused gate and projection keep only `mean` for the gradient.
            kernel = ops.cast(self.output_dense.kernel, self.compute_dtype)
            outputs = gated_output_projection(values, mean, gate_logits, kernel)
        else:  # int8 weights: the quantized layer's own call
            _, _, mixed = gate_and_mix(values, mean, gate_logits)
            outputs = self.output_dense(ops.transpose(ops.cast(mixed, self.compute_dtype), [0, 2, 1, 3]))
        if cache is None:
            return outputs
        # Right padding is not part of the sequence: the next position follows the last real one.
        end = real_extent(padding_mask, length)
        position = start + end if document_starts is None else position_after(index, start, end)
        return outputs, {"log_z": state[0], "mean": state[1], "position": position}

    cache_names = ("log_z", "mean", "position")

    def initial_state(self, batch_size, dtype=None):
        """The state before any position.

        Returns:
            `(log_z [B, H], mean [B, H, D], position [B] int32)`: the running
            normaliser and mean of every head (float32, or float64 for a
            float64 layer) and the index of the next position.
        """
        dtype = accumulator_dtype(dtype or self.compute_dtype)
        log_z, mean = empty_softmax_mean_state(batch_size, self.num_heads, self.head_dim, dtype=dtype)
        return log_z, mean, ops.zeros((batch_size,), "int32")

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "position_dim": self.position_dim,
                "position_scale": self.position_scale,
                "position_mode": self.position_mode,
                "time_scale": self.time_scale,
                "logit_clip": self.logit_clip,
                "chunk_size": self.chunk_size,
                "logit_initializer": keras.initializers.serialize(self.logit_initializer),
                "position_initializer": keras.initializers.serialize(self.position_initializer),
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
