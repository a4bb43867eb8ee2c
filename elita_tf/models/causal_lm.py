"""`ElitaCausalLM`: text in, text out, through keras-hub's `CausalLM` (generate, samplers, presets, fit)."""

import keras
import keras_hub
import tensorflow as tf
from keras import ops

from elita_tf.generation import empty_caches, forward_with_cache
from elita_tf.models.backbone import ElitaBackbone
from elita_tf.models.causal_lm_preprocessor import ElitaCausalLMPreprocessor
from elita_tf.models.decoder import decoder_head
from elita_tf.models.tokenizer import ElitaTokenizer


@keras.saving.register_keras_serializable(package="elita_tf")
class ElitaCausalLM(keras_hub.models.CausalLM):
    """An ELiTA (or related) decoder language model with keras-hub's generation and presets.

    `generate` prefills, in one parallel pass, every position before the
    shortest prompt's last token, then takes one cached step per position:
    constant-size states for ELiTA, linear and additive attention, ring
    buffers for windows, key/value buffers for softmax attention. Prompts
    are right-padded and a row inside its prompt is fed its own next token,
    so each row continues exactly as it would alone, for every block type.
    A training run's directory is a preset: `elita-train` writes one there.

    Args:
        backbone: an `ElitaBackbone`.
        preprocessor: an `ElitaCausalLMPreprocessor`, or None to work on
            `{"token_ids", "padding_mask"}` directly.

    Example:
    >>> causal_lm = ElitaCausalLM.from_preset("runs/compare/elita/seed-0")  # doctest: +SKIP
    >>> causal_lm.generate("The history of", max_length=64)  # doctest: +SKIP
    >>> causal_lm.compile(sampler=keras_hub.samplers.TopKSampler(k=40))  # doctest: +SKIP
    """

    backbone_cls = ElitaBackbone
    preprocessor_cls = ElitaCausalLMPreprocessor

    def __init__(self, backbone, preprocessor=None, **kwargs):
        self.backbone = backbone
        self.preprocessor = preprocessor
        inputs = backbone.input
        super().__init__(inputs=inputs, outputs=backbone(inputs), **kwargs)

    @classmethod
    def from_decoder(cls, model, config, tokenizer_proto, sequence_length=None):
        """The keras-hub model of a trained `build_decoder` model, its `DecoderConfig` and SentencePiece proto.

        The layers share their names, so the weights copy layer by layer.
        `sequence_length` (the preprocessor's) defaults to the training length.
        """
        backbone = ElitaBackbone.from_decoder_config(config)
        for layer in model.layers:
            if layer.weights:
                backbone.get_layer(layer.name).set_weights(layer.get_weights())
        sequence_length = sequence_length or backbone.max_sequence_length
        preprocessor = ElitaCausalLMPreprocessor(ElitaTokenizer(proto=tokenizer_proto), sequence_length=sequence_length)
        return cls(backbone, preprocessor)

    def call_with_cache(self, token_ids, cache, padding_mask=None):
        """Continues the sequence `cache` summarises with `token_ids [B, T]`.

        Args:
            token_ids: int `[B, T]`.
            cache: from `empty_caches` or a previous call: one entry per block and the `position` reached.
            padding_mask: optional bool `[B, T]`; positions after the last
                real one (right padding) are left out of the cache.

        Returns:
            `(logits [B, T, V], hidden_states [B, T, d], cache)`.
        """
        backbone = self.backbone
        hidden, cache = forward_with_cache(
            backbone.decoder_config, backbone.decoder_layers, token_ids, cache, padding_mask, head=False
        )
        logits = decoder_head(backbone.decoder_config, backbone.decoder_layers, hidden)
        return logits, hidden, cache

    def generate_step(self, inputs, stop_token_ids=None):
        """Fills the unmasked positions of `{"token_ids", "padding_mask"}` (right-padded prompts); XLA-compilable."""
        token_ids, padding_mask = inputs["token_ids"], ops.cast(inputs["padding_mask"], "bool")
        config = self.backbone.decoder_config
        batch_size, length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        if isinstance(length, int) and config.decode_limit is not None and length > config.decode_limit:
            raise ValueError(
                f"`max_length` {length} exceeds the {config.decode_limit} positions this model's position table "
                f"or decoding buffers hold: generate at most {config.decode_limit}. Received: max_length={length}"
            )
        row_lengths = ops.sum(ops.cast(padding_mask, "int32"), axis=1)
        index = ops.min(row_lengths)
        # A row with no token has nothing to continue from (the preprocessor always adds the start token).
        empty = tf.debugging.assert_positive(
            index, message="Every prompt needs at least one token: padding_mask has a row with none"
        )
        with tf.control_dependencies([empty]):
            index = tf.identity(index)
        # One parallel pass over every position before the shortest prompt's last token.
        prefill_mask = ops.tile(ops.arange(length)[None, :] < index - 1, [batch_size, 1])
        cache = empty_caches(config, self.backbone.decoder_layers, batch_size)
        # Hidden states only: the prefill's logits (`[B, max_length, V]`) would be computed and thrown away.
        hidden_states, cache = forward_with_cache(
            config, self.backbone.decoder_layers, token_ids, cache, prefill_mask, head=False
        )

        def next(prompt, cache, index):
            token = ops.slice(prompt, [0, index - 1], [batch_size, 1])
            logits, hidden_states, cache = self.call_with_cache(token, cache)
            return ops.squeeze(logits, axis=1), ops.squeeze(hidden_states, axis=1), cache

        token_ids = self.sampler(
            next=next,
            prompt=token_ids,
            cache=cache,
            index=index,
            mask=padding_mask,
            stop_token_ids=stop_token_ids,
            hidden_states=hidden_states,
            model=self,
        )
        if stop_token_ids is not None:
            # Everything after the first stop token past each prompt is padding.
            stops = ops.zeros_like(padding_mask)
            for stop_token_id in stop_token_ids:
                stops = ops.logical_or(stops, ops.equal(token_ids, stop_token_id))
            stops = ops.cast(ops.logical_and(stops, ops.logical_not(padding_mask)), "int32")
            padding_mask = ops.equal(ops.cumsum(stops, axis=1) - stops, 0)
        else:
            padding_mask = ops.ones_like(token_ids, dtype="bool")
        return {"token_ids": token_ids, "padding_mask": padding_mask}
