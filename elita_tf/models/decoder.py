"""`build_decoder`: a functional-API decoder language model from a `DecoderConfig`.

    token ids [B, T] -> embedding (+ learned positions) -> blocks -> final norm -> logits [B, T, V]

Every block is a `DecoderBlock(mixer, ffn, norm, residual)`; the block type
picks the recipe (`make_block`):

    elita        x += Attention2(LN(x));         x += FFN(LN(x))    (LN without scale/centre, as the reference)
    linear       x += LinearAttention(LN(x));    x += FFN(LN(x))
    additive     x += AdditiveAttention(LN(x));  x += FFN(LN(x))
    transformer  x += CausalSelfAttention(LN(x)); x += FFN(LN(x))   (FFN "mlp": 4d GELU)
    simplified   SAS-P, skip-less: x = g_M ShapedAttention(RMSNorm(x)) + g_F FFN(RMSNorm(x))
                 ("mlp": the paper's 4d ReLU MLP without biases; "wide": one One Wide FFN shared by every block)
    3lin         x += TriLinearAttention(x)      (normalises its input itself)

One function, `decoder_forward`, runs the blocks in order: on a `keras.Input`
it builds the functional model; on token ids with caches it is the decoding
step (`elita_tf.generation`). Nothing in it depends on the block type, so
training and decoding can never disagree on the architecture.
"""

import keras
import tensorflow as tf
from keras.src.backend.common.symbolic_scope import in_symbolic_scope

from elita_tf.layers import (
    AdditiveAttention,
    Attention2,
    CausalSelfAttention,
    DecoderBlock,
    FeedForward2,
    LinearAttention,
    PositionEmbedding,
    ShapedAttention,
    TokenEmbedding,
    TriLinearAttention,
    WideFeedForward,
)
from elita_tf.layers.checks import check_integer_ids
from elita_tf.layers.trilinear import alibi_v1
from elita_tf.models.config import DecoderConfig
from elita_tf.ops.cross_entropy import chunked_cross_entropy


def _additive_window(config, index):
    if config.windows is not None:
        return config.windows[index]
    # The reference: 4 * 2^l, the last layer global.
    return None if index == config.num_layers - 1 else 4 * 2**index


def make_mixer(config, index):
    """The token mixer of block `index`: its block type's attention layer."""
    block = config.blocks[index]
    if block == "elita":
        return Attention2(
            config.num_heads,
            config.head_dim,
            config.position_dim,
            context_length=config.position_scale or config.context_length,
            position_mode=config.position_mode,
            name="mixer",
        )
    if block == "linear":
        return LinearAttention(config.num_heads, config.head_dim, name="mixer")
    if block == "additive":
        return AdditiveAttention(
            config.num_heads, window=_additive_window(config, index), dropout=config.dropout, name="mixer"
        )
    if block == "transformer":
        return CausalSelfAttention(
            config.num_heads,
            head_dim=config.head_dim,
            dropout=config.dropout,
            max_length=config.context_length,
            name="mixer",
        )
    if block == "simplified":
        value_projection = config.first_value_projection and index == config.blocks.index("simplified")
        return ShapedAttention(
            config.num_heads, value_projection=value_projection, max_length=config.context_length, name="mixer"
        )
    slope, hyper, wide = alibi_v1(index)
    window = 64 if config.windows is None or config.windows[index] is None else config.windows[index]
    return TriLinearAttention(
        # The reference's proportions (dim 256: qdim 128, tt 64); tt a multiple of 16.
        query_dim=max(16, config.width // 2),
        lowrank_dim=max(16, config.width // 4 // 16 * 16),
        window=window,
        slope=slope,
        hyper=hyper,
        wide=wide,
        max_length=config.context_length,
        name="mixer",
    )


def make_ffn(config, index, shared_ffn=None):
    """The feed-forward network of block `index`, or None (`ffn="none"`, 3Lin)."""
    block = config.blocks[index]
    if config.ffn == "none" or block == "3lin":
        return None
    if config.ffn == "wide":
        return shared_ffn
    if config.ffn == "feedforward2":
        return FeedForward2(factor=config.ffn_factor, name="ffn")
    if block == "simplified":  # the Simplified Transformer's MLP: ReLU, no biases, N(0, 0.02)
        init = keras.initializers.RandomNormal(stddev=0.02)
        return WideFeedForward(num_layers=1, use_bias=False, kernel_initializer=init, name="ffn")
    init = (
        "glorot_uniform"
        if config.ffn_init_stddev is None
        else keras.initializers.RandomNormal(stddev=config.ffn_init_stddev)
    )
    return WideFeedForward(
        num_layers=1, activation="gelu", use_bias=config.ffn_bias, kernel_initializer=init, name="ffn"
    )


def make_block(config, index, shared_ffn=None):
    """Block `index` of `config`: a `DecoderBlock` of its block type's mixer, FFN, norm and residual form."""
    block = config.blocks[index]
    mixer, ffn = make_mixer(config, index), make_ffn(config, index, shared_ffn)

    def decoder_block(norm, epsilon, **kwargs):
        epsilon = epsilon if config.norm_epsilon is None else config.norm_epsilon
        return DecoderBlock(
            mixer, ffn, norm=norm, norm_epsilon=epsilon, dropout=config.dropout, name=f"block_{index}", **kwargs
        )

    if block == "simplified":
        return decoder_block("rms_norm", 1e-5, residual="parallel")
    if block == "3lin":
        return decoder_block(None, 1e-5)
    if block == "transformer":
        return decoder_block("layer_norm", 1e-5)
    # ELiTA's LayerNorm has no scale or centre, as the reference; Keras' epsilon for the others.
    return decoder_block("unscaled_layer_norm" if block == "elita" else "layer_norm", 1e-3)


def make_layers(config):
    """Every layer of the decoder, by its stable name (`embedding`, `block_{i}`, `final_norm`, ...)."""
    layers = {"embedding": TokenEmbedding(config.vocab_size, config.width, tie_weights=config.tied_embeddings)}
    if config.position_embedding:
        layers["position_embedding"] = PositionEmbedding(config.context_length)
    if config.embedding_norm:
        epsilon = 1e-3 if config.norm_epsilon is None else config.norm_epsilon
        layers["embedding_norm"] = keras.layers.LayerNormalization(epsilon=epsilon)
    layers["embedding_dropout"] = keras.layers.Dropout(config.dropout)
    shared_ffn = WideFeedForward(num_layers=config.num_layers, name="wide_ffn") if config.ffn == "wide" else None
    for i in range(config.num_layers):
        layers[f"block_{i}"] = make_block(config, i, shared_ffn)
    if config.final_norm:
        layers["final_norm"] = keras.layers.LayerNormalization()
    if not config.tied_embeddings:
        layers["logits"] = keras.layers.Dense(config.vocab_size, dtype="float32")
    for name, layer in layers.items():
        layer.name = name  # stable names: weights load by name, decoding finds layers by name
    return layers


def decoder_forward(
    config, layers, tokens, padding_mask=None, caches=None, start_index=None, training=None, head=True, resets=None
):
    """The decoder on token ids, from `make_layers` (or a built model's layers by name).

    Args:
        config: `DecoderConfig`.
        layers: mapping from layer name to layer.
        tokens: int `[B, T]` token ids (a `keras.Input` to build a model).
        padding_mask: optional bool `[B, T]`, False at padding.
        caches: optional list, one cache per block (`get_initial_cache`): decode.
        start_index: optional int `[B]`, the position of `tokens[:, 0]` (decoding).
        training: bool.
        head: bool. False returns the final hidden states `[B, T, d]` in place of the logits.
        resets: optional bool `[B, T]`, True where a new document starts: no
            position sees anything of an earlier document (packed documents,
            or a stream carried in `caches`). Models whose every block keeps
            a constant-size state, without learned positions, take it.

    Returns:
        float32 logits `[B, T, V]`, or `(logits, new_caches)` with caches.
    """
    if resets is not None and config.decode_limit is not None:
        raise ValueError(
            "Documents restarting inside a sequence (`resets`) need blocks that keep a constant-size state and no "
            f"learned positions (elita, linear, additive). Received: blocks={sorted(set(config.blocks))}, "
            f"position_embedding={config.position_embedding}"
        )
    x = layers["embedding"](tokens)
    if config.position_embedding:
        x = x + layers["position_embedding"](x, start_index=start_index)
    if config.embedding_norm:
        x = layers["embedding_norm"](x)
    x = layers["embedding_dropout"](x, training=training)
    new_caches = []
    for i in range(config.num_layers):
        block = layers[f"block_{i}"]
        extra = {} if resets is None else {"resets": resets}
        if caches is None:
            x = block(x, padding_mask=padding_mask, training=training, **extra)
        else:
            x, cache = block(x, padding_mask=padding_mask, cache=caches[i], training=training, **extra)
            new_caches.append(cache)

    if config.final_norm:
        x = layers["final_norm"](x)
    if not head:
        return x if caches is None else (x, new_caches)
    logits = decoder_head(config, layers, x)
    return logits if caches is None else (logits, new_caches)


def decoder_head(config, layers, hidden):
    """Float32 logits `[B, T, V]` from the final hidden states `[B, T, d]`."""
    logits = layers["embedding"](hidden, reverse=True) if config.tied_embeddings else layers["logits"](hidden)
    logits = keras.ops.cast(logits, "float32")
    return logits * config.width**-0.5 if config.scaled_tied_logits else logits


def decoder_head_loss(config, layers, hidden, labels, gradient_in_forward=False):
    """Per-token cross-entropy `[B, T]` of the head on `hidden [B, T, d]`, without the `[B, T, V]` logits.

    The same logits as `decoder_head` (the tied embedding's transpose or the
    `logits` layer, and the tied head's scale), taken a chunk of tokens at a
    time by `chunked_cross_entropy`, float32 whatever the compute dtype.
    `gradient_in_forward=True` (training a mean loss) saves the backward
    pass its recomputation of the logits.
    """
    if config.tied_embeddings:
        kernel, bias = keras.ops.transpose(layers["embedding"].embeddings), None
    else:
        kernel, bias = layers["logits"].kernel, layers["logits"].bias
    scale = config.width**-0.5 if config.scaled_tied_logits else 1.0
    return chunked_cross_entropy(
        hidden, kernel, labels, bias=bias, scale=scale, gradient_in_forward=gradient_in_forward
    )


@keras.saving.register_keras_serializable(package="elita_tf")
class DecoderModel(keras.Model):
    """The functional decoder, with a training step that never holds the `[B, T, V]` logits.

    - Float token ids are refused: a functional model converts its inputs to
      the `keras.Input` dtype, so `[[1.5, 2.0]]` would silently become
      `[[1, 2]]`; here it is a `TypeError`. Ids out of range are refused by
      the embedding (`check_token_ids`).
    - Compiled with `SparseCategoricalCrossentropy(from_logits=True)` and no
      metrics (as `elita-train` compiles it), `fit` and `evaluate` take the
      loss from the final hidden states with `decoder_head_loss`: a chunk of
      tokens at a time, so the step's peak memory holds one chunk's logits,
      not all of them with their gradient (docs/math.md §10). It is the same
      loss as Keras' on the logits `call` returns. Any other loss, metric or
      sample weight, or `chunked_head = False`, takes Keras' own steps.
    """

    decoder_config = None  # `DecoderConfig`, set by `build_decoder`
    chunked_head = True
    carried_state = None  # the caches `fit` carries from batch to batch (`enable_carried_state`)

    def enable_carried_state(self, batch_size):
        """Makes `fit` carry every block's decoding state from one batch to the next.

        Truncated backpropagation through time: `fit` then takes batches
        `((token_ids [B, T], resets [B, T]), labels [B, T])` of consecutive
        segments of `batch_size` streams (`elita_tf.data.stream_dataset`).
        Each step continues from the state the previous one left (a
        constant, with no gradient: gradients stop at segment boundaries), and
        no position sees anything before its document's start (`resets`). The
        state is saved with the model, so a resumed run continues exactly.

        Raises:
            ValueError: for a model with a block that keeps no constant-size
                state, or learned positions.
        """
        from elita_tf.generation import empty_caches

        config = self.decoder_config
        if config is None or config.decode_limit is not None:
            raise ValueError(
                "Carrying the state needs blocks that keep a constant-size state and no learned positions "
                "(elita, linear, additive). Received: "
                + (
                    "no decoder_config"
                    if config is None
                    else f"blocks={sorted(set(config.blocks))}, position_embedding={config.position_embedding}"
                )
            )
        caches = empty_caches(config, {layer.name: layer for layer in self.layers}, batch_size)
        with tf.init_scope():
            self.carried_state = tf.nest.map_structure(lambda t: tf.Variable(t, trainable=False), caches)

    def call(self, inputs, training=None, mask=None):
        # Keras traces with placeholders of guessed dtypes (float64 under a distribution strategy)
        # to build losses and metrics: only real inputs are checked.
        if not in_symbolic_scope():
            check_integer_ids(inputs, self.get_layer("embedding").input_dim)
        return super().call(inputs, training=training, mask=mask)

    def _chunked_head_applies(self, sample_weight):
        loss = getattr(self, "loss", None)
        if not self.chunked_head or self.decoder_config is None:
            return False
        if sample_weight is not None or self._compile_metrics is not None:
            return False
        if not isinstance(loss, keras.losses.SparseCategoricalCrossentropy):
            return False
        loss_config = loss.get_config()
        return (
            loss_config["from_logits"]
            and loss_config.get("ignore_class") is None
            and loss_config["reduction"] == "sum_over_batch_size"
        )

    def _chunked_head_loss(self, tokens, labels, training, resets=None):
        """The batch's mean loss, scaled for the replicas as Keras scales a compiled loss.

        With `resets`, the forward continues from the carried state, which it updates.
        """
        check_integer_ids(tokens, self.get_layer("embedding").input_dim)
        layers = {layer.name: layer for layer in self.layers}
        if resets is None:
            hidden = decoder_forward(self.decoder_config, layers, tokens, training=training, head=False)
        else:
            from elita_tf.generation import forward_with_cache

            caches = tf.nest.map_structure(lambda v: v.read_value(), self.carried_state)
            hidden, caches = forward_with_cache(
                self.decoder_config, layers, tokens, caches, head=False, resets=resets, training=training
            )
            tf.nest.map_structure(lambda v, t: v.assign(t), self.carried_state, caches)
        per_token = decoder_head_loss(self.decoder_config, layers, hidden, labels, gradient_in_forward=training)
        loss = keras.ops.mean(per_token)
        for extra in self.losses:  # regularisers, as `compute_loss` adds them
            loss = loss + keras.ops.cast(keras.ops.sum(extra), loss.dtype)
        return loss / tf.distribute.get_strategy().num_replicas_in_sync

    def _track_loss(self, loss, tokens):
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        self._loss_tracker.update_state(loss * replicas, sample_weight=tf.shape(tokens)[0])

    def train_step(self, data):
        tokens, labels, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        resets = None
        if self.carried_state is not None:
            if not (
                isinstance(tokens, (tuple, list)) and len(tokens) == 2 and self._chunked_head_applies(sample_weight)
            ):
                raise ValueError(
                    "With a carried state, `fit` takes `((token_ids, resets), labels)` batches (stream_dataset), "
                    "compiled with SparseCategoricalCrossentropy(from_logits=True), no metrics and no sample weight. "
                    f"Received: inputs {tokens!r}"
                )
            tokens, resets = tokens
        elif not self._chunked_head_applies(sample_weight):
            return super().train_step(data)
        with tf.GradientTape() as tape:
            loss = self._chunked_head_loss(tokens, labels, training=True, resets=resets)
            self._track_loss(loss, tokens)
            scaled = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, self.trainable_weights)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))
        return self.get_metrics_result()

    def test_step(self, data):
        tokens, labels, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if not self._chunked_head_applies(sample_weight):
            return super().test_step(data)
        self._track_loss(self._chunked_head_loss(tokens, labels, training=False), tokens)
        return self.get_metrics_result()

    def _carried_variables(self):
        return tf.nest.flatten(self.carried_state) if self.carried_state is not None else []

    def save_own_variables(self, store):
        super().save_own_variables(store)
        for i, variable in enumerate(self._carried_variables()):
            store[f"carried_state_{i}"] = variable.numpy()

    def load_own_variables(self, store):
        carried = {key for key in store.keys() if key.startswith("carried_state_")}
        super().load_own_variables({key: store[key] for key in store.keys() if key not in carried})
        for i, variable in enumerate(self._carried_variables()):
            variable.assign(store[f"carried_state_{i}"])

    def get_config(self):
        config = super().get_config()
        if self.decoder_config is not None:
            config["decoder_config"] = self.decoder_config.get_config()
        if self.carried_state is not None:
            config["carried_state_batch_size"] = int(self.carried_state["position"].shape[0])
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        decoder_config = config.pop("decoder_config", None)
        carried_batch_size = config.pop("carried_state_batch_size", None)
        model = super().from_config(config, custom_objects=custom_objects)
        if decoder_config is not None:
            model.decoder_config = DecoderConfig.from_config(decoder_config)
        if carried_batch_size is not None:
            model.enable_carried_state(carried_batch_size)
        return model


def build_decoder(config, name=None):
    """A decoder language model for `config` (a `DecoderConfig` or its dict).

    Returns:
        A `keras.Model` mapping int token ids `[B, T]` to float32 logits
        `[B, T, vocab_size]`. Layer names are stable (`block_{i}`,
        `ffn_{i}`, ...) so weights load by name and decoding finds them.

    Example:
    >>> from elita_tf.models import preset
    >>> model = build_decoder(preset("elita", vocab_size=100, width=32, num_layers=2))
    >>> model(tf.zeros([2, 16], tf.int32)).shape
    TensorShape([2, 16, 100])
    """
    if isinstance(config, dict):
        config = DecoderConfig.from_config(config)
    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    logits = decoder_forward(config, make_layers(config), tokens)
    model = DecoderModel(tokens, logits, name=name or "decoder")
    model.decoder_config = config
    return model
