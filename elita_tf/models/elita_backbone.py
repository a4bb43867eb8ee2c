"""`ElitaBackbone`: the decoder language model, as a keras-hub `Backbone`.

    token ids [B, T] -> token embedding (+ learned positions) -> blocks -> final norm -> logits [B, T, V]

Every block is a `DecoderBlock(mixer, ffn, norm, residual)`; the block type picks its parts:

    elita        x += Attention2(LN(x));         x += FFN(LN(x))    (LN without scale/centre, as the reference)
    linear       x += LinearAttention(LN(x));    x += FFN(LN(x))
    additive     x += AdditiveAttention(LN(x));  x += FFN(LN(x))
    transformer  x += CausalSelfAttention(LN(x)); x += FFN(LN(x))   (FFN "mlp": 4d GELU)
    simplified   SAS-P, skip-less: x = g_M ShapedAttention(RMSNorm(x)) + g_F FFN(RMSNorm(x))
                 ("mlp": the paper's 4d ReLU MLP without biases; "wide": one One Wide FFN shared by every block)
    3lin         x += TriLinearAttention(x)      (normalises its input itself)

One function runs the layers in order (`_run_layers`): on `keras.Input`s it builds the functional
model; on token ids with a cache it is the decoding step. Nothing in it depends on the block type,
so training, evaluation, generation and the exports can never disagree on the architecture.
"""

import inspect

import keras
import keras_hub

from elita_tf.checks import fail
from elita_tf.models import lora
from elita_tf.models.architectures import (
    ARGUMENT_CHECKS,
    DEFAULT_SEQUENCE_LENGTH,
    MODEL_SIZES,
    architecture,
    carries_state,
    check_architecture,
    check_carries_state,
    decode_limit,
    upgrade_config,
)
from elita_tf.models.decoder_layers import make_layers
from elita_tf.models.dtype_policies import SavedPolicies
from elita_tf.models.layouts import layout_map
from elita_tf.models.presets import check_preset, saved_mixed_precision
from elita_tf.ops.cross_entropy import chunked_cross_entropy
from elita_tf.ops.utils.documents import document_positions, position_after
from elita_tf.ops.utils.positions import real_extent
from elita_tf.ops.utils.token_ids import check_integer_ids
from elita_tf.private_apis import in_symbolic_scope
from elita_tf.renames import accepts_renamed_arguments


def _run_layers(
    config, layers, token_ids, padding_mask=None, cache=None, document_starts=None, training=None, intercept=None
):
    """Final hidden states `[B, T, d]` (and the new cache, with `cache`) of the layers on token ids.

    `intercept(x, i)`, if given, sees and may replace the activations: the embedded tokens (`i = -1`)
    and each block's output (`i = 0, 1, ...`), as keras-hub's `score(layer_intercept_fn=...)`.
    """
    blocks = None if cache is None else [cache[f"block_{i}"] for i in range(config["num_layers"])]
    start = None if cache is None else cache["position"]
    x = layers["token_embedding"](token_ids)
    if config["position_embedding"]:
        x = x + layers["position_embedding"](x, start_index=start, document_starts=document_starts)
    if config["embedding_norm"]:
        x = layers["embedding_norm"](x)
    if intercept is not None:
        x = intercept(x, -1)
    x = layers["embedding_dropout"](x, training=training)
    extra = {} if document_starts is None else {"document_starts": document_starts}
    new_cache = {}
    for i in range(config["num_layers"]):
        block = layers[f"block_{i}"]
        if cache is None:
            x = block(x, padding_mask=padding_mask, training=training, **extra)
        else:
            x, new_cache[f"block_{i}"] = block(
                x, padding_mask=padding_mask, cache=blocks[i], training=training, **extra
            )
        if intercept is not None:
            x = intercept(x, i)
    if config["final_norm"]:
        x = layers["final_norm"](x)
    if cache is None:
        return x
    length = keras.ops.shape(token_ids)[1]
    end = real_extent(padding_mask, length)
    if document_starts is None:
        new_cache["position"] = start + end
    else:
        new_cache["position"] = position_after(document_positions(length, start, document_starts), start, end)
    return x, new_cache


def _logits(config, layers, hidden):
    # In the compute dtype, as keras-hub's heads: the training loss takes float32 logits a chunk at a time
    # (`ElitaBackbone.token_losses`), not these.
    logits = (
        layers["token_embedding"](hidden, reverse=True) if config["tie_word_embeddings"] else layers["logits"](hidden)
    )
    return logits * config["hidden_dim"] ** -0.5 if config["scaled_tied_logits"] else logits


_SEED = MODEL_SIZES["seed"]  # the default size


@keras.saving.register_keras_serializable(package="elita_tf")
class ElitaBackbone(lora.LoraAdapters, SavedPolicies, keras_hub.models.Backbone):
    """A decoder language model of ELiTA or any related block, as a keras-hub backbone.

    `{"token_ids": int [B, T], "padding_mask": [B, T]}` -> logits
    `[B, T, vocabulary_size]` in the compute dtype. Like keras-hub's RWKV-7 backbone it ends in the
    language-model head, so `ElitaBackbone.from_preset(path)` gives the whole
    trained network. The arguments are the architecture: `get_config()`
    returns them, and a training run's manifest records them as they are.
    `ElitaBackbone.from_architecture(name, ...)` starts from a named architecture
    (`elita_tf.models.ARCHITECTURES`); `docs/math.md` writes out every block.

    Args:
        vocabulary_size: int. Size of the token vocabulary.
        num_layers: int. Number of blocks.
        num_heads: int. Heads per attention layer.
        hidden_dim: int. Model width `d`.
        head_dim: int. Width per head (ELiTA values, linear attention,
            Transformer). These four default to `MODEL_SIZES["seed"]`'s
            (6, 4, 64 and 16).
        max_sequence_length: int, at least 2. The positions the finite
            buffers hold: learned position tables, key/value buffers and 3Lin's
            wide layers (each layer's `max_sequence_length`), and ELiTA's
            `position_scale` unless given. A run trains on examples of this
            length (`TrainSettings.sequence_length`). Models without finite
            buffers (ELiTA, and linear or additive blocks without learned
            positions) generate past it. Defaults to `DEFAULT_SEQUENCE_LENGTH` (256).
        intermediate_dim: int or None. The feed-forward network's inner
            width: the MLP's hidden units (None: `4 * hidden_dim`, the One
            Wide FFN's `4 * hidden_dim * num_layers`), or `FeedForward2`'s
            first branch (None: `hidden_dim`).
        position_scale: int or None. ELiTA's position scale `L`, the length
            its sinusoidal positions span: `u_i = i / (L - 1)`. None (the
            default) uses `max_sequence_length`.
        position_mode: ELiTA's positions (see `Attention2`): `"fixed"`
            (the default; past `L` the sinusoids run on), `"clamped"` (every
            position past `L - 1` reads as `L - 1`) or `"length"` (the
            original's `u_i = i / (T - 1)`, which moves with the sequence
            length: it trains and evaluates in sequences, but cannot decode).
        logit_clip: float or None. Clip ELiTA's logits to `±logit_clip`, as
            the original did at 20. Defaults to None (exact).
        blocks: str, or one str per layer: `"elita"`, `"transformer"`,
            `"simplified"`, `"linear"`, `"3lin"` or `"additive"`. Defaults to `"elita"`.
        ffn: `"feedforward2"` (the default), `"mlp"`, `"wide"` (One Wide FFN) or `"none"`.
        ffn_factor: int. `FeedForward2`'s second branch width. Defaults to `8`.
        position_dim: int. Sinusoid components of ELiTA's position terms. Defaults to `16`.
        position_embedding: bool. Add learned absolute position embeddings. Defaults to `False`.
        sliding_window_sizes: None or one size (int or None) per layer: the
            positions an additive, 3Lin or Transformer block sees; a None entry
            makes an additive or Transformer block global and gives a 3Lin block 64.
            None picks the originals' defaults: `4 * 2**l` with the last layer
            global for additive, 64 for 3Lin, every position for the Transformer.
        dropout: float in `[0, 1)`. The dropout rate of every dropout in
            training: on the embeddings (after `embedding_norm`), on each
            block's mixer and feed-forward outputs before they join the
            residual stream (`DecoderBlock`), on the Transformer's attention
            weights (`CausalSelfAttention`) and on the additive blocks' two
            pooled vectors (`AdditiveAttention`); ELiTA's, linear, shaped and
            3Lin mixers have none inside. `TrainSettings.dropout`. Defaults to `0.0`.
        tie_word_embeddings: bool. The head uses the token embedding matrix. Defaults to `False`.
        norm: None (each block type's own norm), or the norm of every block
            that has one: `"layer_norm"`, `"unscaled_layer_norm"`, `"rms_norm"`
            or `"rms_norm_outer_epsilon"` (see `DecoderBlock`).
        layer_norm_epsilon: float or None. Epsilon of every norm: the blocks', the
            embedding norm's and the final norm's. None keeps each one's own
            (1e-3 for ELiTA, linear and additive blocks and the final norm, 1e-5
            for the Transformer's and the Simplified Transformer's blocks).
        embedding_norm: bool. A LayerNorm over `E + P` before the first block,
            as fastformerLM's. Defaults to `False`.
        final_norm: bool. A LayerNorm after the last block. Defaults to `True`.
        scaled_tied_logits: bool. Tied logits divided by `sqrt(hidden_dim)`, as
            fastformerLM's. Needs `tie_word_embeddings`. Defaults to `False`.
        ffn_bias: bool. Biases in the `"mlp"` FFN of every block but
            `"simplified"` (whose MLP never has them). Defaults to `True`.
        ffn_init_stddev: float or None. `N(0, σ²)` init of that FFN's kernels
            (GPT-2 style, fastformerLM's 0.02); None is Keras' Glorot.
        first_value_projection: bool. A learned value projection with gains in
            the first `"simplified"` block, as the Simplified Transformer's
            official configuration. Defaults to `False`.
        short_convolution: int `K` or None. A `ShortConvolution` of kernel
            size `K` before the mixer of every block (`M(S(n(x)))`), the
            token shift that linear models need to recall. Defaults to `None`.
        attention_interval: int `k` or None. Hybrid: the first block and every
            `k`-th above it are `"transformer"` blocks (global softmax
            attention), the others as `blocks` says. With a short convolution,
            attention first recalls where attention last does not
            (`docs/results.md`). Defaults to `None`.
        lora_rank: int or None. Start with LoRA adapters of this rank on every
            projection (`enable_lora`); an adapted model's config records it,
            so it saves and loads with its adapters. Defaults to `None`.
        dtype: optional dtype policy of every layer (e.g. `"mixed_bfloat16"`).
            Every layer and the logits follow it, as in keras-hub's models;
            recurrent states, accumulators and the training loss stay float32.

    Every projection is a Keras `Dense` or `EinsumDense` layer and the token
    embedding a Keras `ReversibleEmbedding`, so `quantize("int8")` covers them
    all (a quantized backbone saves and loads as a preset) and
    `enable_lora(rank)` adapts every projection (`default_lora_layer_names`);
    the documented weights stay reachable by name
    (`backbone.get_layer("block_0").mixer.k1` is ELiTA's `k1` kernel).

    Example:
    >>> backbone = ElitaBackbone.from_architecture("elita", vocabulary_size=100, num_layers=2, hidden_dim=32)
    >>> ones = keras.ops.ones((2, 8), "int32")
    >>> tuple(backbone({"token_ids": ones, "padding_mask": ones}).shape)
    (2, 8, 100)
    """

    @accepts_renamed_arguments
    def __init__(
        self,
        vocabulary_size,
        num_layers=_SEED["num_layers"],
        num_heads=_SEED["num_heads"],
        hidden_dim=_SEED["hidden_dim"],
        head_dim=_SEED["head_dim"],
        max_sequence_length=DEFAULT_SEQUENCE_LENGTH,
        intermediate_dim=None,
        position_scale=None,
        position_mode="fixed",
        logit_clip=None,
        blocks="elita",
        ffn="feedforward2",
        ffn_factor=8,
        position_dim=16,
        position_embedding=False,
        sliding_window_sizes=None,
        dropout=0.0,
        tie_word_embeddings=False,
        norm=None,
        layer_norm_epsilon=None,
        embedding_norm=False,
        final_norm=True,
        scaled_tied_logits=False,
        ffn_bias=True,
        ffn_init_stddev=None,
        first_value_projection=False,
        short_convolution=None,
        attention_interval=None,
        lora_rank=None,
        dtype=None,
        **kwargs,
    ):
        arguments = locals()
        config = check_architecture({name: arguments[name] for name in ARGUMENT_CHECKS})
        # === Layers ===
        layers = make_layers(config, dtype)
        self.token_embedding = layers["token_embedding"]

        # === Functional model ===
        token_ids = keras.Input((None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input((None,), dtype="int32", name="padding_mask")
        hidden = _run_layers(config, layers, token_ids, keras.ops.cast(padding_mask, "bool"))
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask},
            outputs=_logits(config, layers, hidden),
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self._architecture = config
        self._layers_by_name = layers
        for name, value in config.items():
            setattr(self, name, value)
        self.lora_rank = None
        if lora_rank is not None:  # a saved adapted model: its adapters come back before its weights load
            self.enable_lora(lora_rank)

    @property
    def decode_limit(self):
        """The positions generation can reach (`architectures.decode_limit`): `max_sequence_length`, or None."""
        return decode_limit(self.blocks, self.position_embedding, self.max_sequence_length)

    @property
    def carries_state(self):
        """Whether this model can carry its state over a stream of any length (`TrainSettings.carry_state`,
        `document_starts` with a cache): every block keeps a constant-size state, no learned positions, and
        positions that do not move with the length (`architectures.carries_state`)."""
        return carries_state(self._architecture)

    def check_carries_state(self):
        """Raises `ValueError`, naming the blocks and positions, unless `carries_state`."""
        check_carries_state(self._architecture)

    def call(self, inputs, training=None, mask=None):
        # A functional model casts its inputs to the `keras.Input` dtype: float ids would be truncated silently.
        if not in_symbolic_scope() and isinstance(inputs, dict) and "token_ids" in inputs:
            check_integer_ids(inputs["token_ids"], self.vocabulary_size)
        return super().call(inputs, training=training, mask=mask)

    def check_decodes(self):
        """Raises ValueError, naming the position mode, when this model cannot decode step by step."""
        if self.position_mode == "length":
            raise ValueError(
                "position_mode='length' moves every position with the sequence length: a cache of earlier "
                "positions is never valid, so this model cannot decode step by step. Use position_mode='fixed' "
                f"or 'clamped' (the same weights). Received: position_mode={self.position_mode!r}"
            )

    def get_initial_cache(self, batch_size):
        """The decoding cache before any position: each block's (`block_{i}`) and each row's `position` `[B]`."""
        self.check_decodes()
        cache = {
            f"block_{i}": self.get_layer(f"block_{i}").get_initial_cache(batch_size) for i in range(self.num_layers)
        }
        cache["position"] = keras.ops.zeros([batch_size], "int32")
        return cache

    @accepts_renamed_arguments
    def hidden_states(
        self, token_ids, padding_mask=None, cache=None, document_starts=None, training=None, intercept=None
    ):
        """The final hidden states `[B, T, d]` on token ids, continuing `cache` when given.

        Args:
            token_ids: int `[B, T]`.
            padding_mask: optional bool `[B, T]`, False at padding. Right
                padding is not part of a row's sequence: its cache ends after
                the row's last real position, and what follows overwrites it.
            cache: optional, from `get_initial_cache` or an earlier call: row
                `b` continues at `cache["position"][b]`.
            document_starts: optional bool `[B, T]`, True where a new document starts:
                no position sees anything of an earlier document, and
                positions restart at 0 there. Every model takes them without
                a cache (packed documents); a stream carried in `cache` over
                several positions needs a model that `carries_state`.
            training: bool, for dropout.
            intercept: optional `f(x, i) -> x` applied to the embedded tokens
                (`i = -1`) and to each block's output (`i = 0, 1, ...`).

        Returns:
            `hidden [B, T, d]`, or `(hidden, new_cache)` with a cache.
        """
        token_ids = check_integer_ids(token_ids, self.vocabulary_size)
        if document_starts is not None and cache is not None and token_ids.shape[1] != 1:
            self.check_carries_state()  # a stream carried in a cache, restarting at documents
        return _run_layers(
            self._architecture,
            self._layers_by_name,
            token_ids,
            padding_mask,
            cache,
            document_starts,
            training,
            intercept,
        )

    def logits(self, hidden):
        """Logits `[B, T, V]` (compute dtype) from final hidden states `[B, T, d]`: the head."""
        return _logits(self._architecture, self._layers_by_name, hidden)

    def token_losses(self, hidden, labels, sample_weight=None, reduction="none"):
        """The head's cross-entropy on `hidden [B, T, d]`, per token `[B, T]` or summed, without `[B, T, V]` logits.

        The same logits as `logits` (the tied embedding's transpose or the
        `logits` layer, and the tied head's scale), taken a chunk of tokens
        at a time by `chunked_cross_entropy`, float32 whatever the compute
        dtype. `reduction="sum"` (training) gives `Σ sample_weight * loss`
        and forms its gradients in the forward pass, which saves the
        backward pass its recomputation of the logits. A quantized head
        (`quantize("int8")`) is read through its own call, which dequantizes.
        """
        head = self.token_embedding if self.tie_word_embeddings else self.get_layer("logits")
        if head.quantization_mode is not None:
            logits = keras.ops.cast(self.logits(hidden), "float32")
            losses = keras.ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            if sample_weight is not None:
                losses = losses * keras.ops.cast(sample_weight, losses.dtype)
            return keras.ops.sum(losses) if reduction == "sum" else losses
        if self.tie_word_embeddings:
            kernel, bias = keras.ops.transpose(head.embeddings), None
        else:
            kernel, bias = head.kernel, head.bias
        scale = self.hidden_dim**-0.5 if self.scaled_tied_logits else 1.0
        return chunked_cross_entropy(
            hidden, kernel, labels, bias=bias, scale=scale, sample_weight=sample_weight, reduction=reduction
        )

    def get_config(self):
        config = super().get_config()
        config.update(self._architecture)
        if self.lora_rank is not None:
            config["lora_rank"] = self.lora_rank
        return config

    @classmethod
    def from_config(cls, config):
        return super().from_config(upgrade_config(config))  # a preset or checkpoint of an older elita-tf

    def count_params_without_embeddings(self):
        """Weights of the blocks and norms: `count_params()` less the token and position tables and the head."""
        tables = [name for name in ("token_embedding", "position_embedding", "logits") if name in self._layers_by_name]
        return self.count_params() - sum(self.get_layer(name).count_params() for name in tables)

    @classmethod
    @accepts_renamed_arguments
    def from_architecture(cls, name, vocabulary_size, **overrides):
        """A randomly initialised backbone of a named architecture (`elita_tf.models.ARCHITECTURES`), with overrides.

        Example:
        >>> ElitaBackbone.from_architecture("transformer", vocabulary_size=100, num_layers=2).num_layers
        2
        """
        return cls(vocabulary_size=vocabulary_size, **{**architecture(name), **overrides})

    @staticmethod
    def get_layout_map(device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch", *, config):
        """keras-hub's `get_layout_map` for a backbone of `config` (`architecture_config(...)` or a `get_config()`):
        heads or features and the vocabulary cut along the model axis (`elita_tf.models.layouts` has an example)."""
        return layout_map(device_mesh, _checked(config), model_parallel_dim_name, data_parallel_dim_name)

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """keras-hub's `from_preset`: a preset directory or a `kaggle://` or `hf://` handle, checked first.

        A quantized preset (`quantize("int8")`, then `save_to_preset`) loads
        quantized, through this class or keras-hub's generic `Backbone.from_preset`;
        a mixed-precision one in its policy, or in the `dtype` given (`dtype="float32"`).
        """
        preset = check_preset(preset, load_weights)
        if kwargs.get("dtype") is None:
            kwargs["dtype"] = saved_mixed_precision(preset)
        return super().from_preset(preset, load_weights=load_weights, **kwargs)


@accepts_renamed_arguments
def architecture_config(name, **overrides):
    """The config of architecture `name` with overrides, as `ElitaBackbone(**config)` takes it, checked.

    These are the `get_config()` fields of the backbone it builds (without
    Keras' `name`, `trainable` and `dtype`): what a run's manifest records.

    Example:
    >>> architecture_config("transformer", vocabulary_size=100)["position_embedding"]
    True
    """
    return _checked({**architecture(name), **overrides})


def _checked(arguments):
    """The architecture in `arguments` (a config holds Keras' fields too), the rest defaults, checked."""
    if not isinstance(arguments, dict):
        fail("config", arguments, "a backbone's config, a dict (`architecture_config(...)` or `get_config()`)")
    parameters = inspect.signature(ElitaBackbone.__init__).parameters.items()
    defaults = {key: p.default for key, p in parameters if key in ARGUMENT_CHECKS and p.default is not p.empty}
    return check_architecture({**defaults, **{key: arguments[key] for key in ARGUMENT_CHECKS if key in arguments}})
