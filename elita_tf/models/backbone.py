"""`ElitaBackbone`: the decoder as a keras-hub `Backbone`, for `from_preset`, `save_to_preset` and `ElitaCausalLM`."""

import keras
import keras_hub

from elita_tf.models.config import PRESETS, DecoderConfig
from elita_tf.models.decoder import decoder_forward, make_layers


@keras.saving.register_keras_serializable(package="elita_tf")
class ElitaBackbone(keras_hub.models.Backbone):
    """A decoder language model of ELiTA or any related block, as a keras-hub backbone.

    `{"token_ids": int [B, T], "padding_mask": [B, T]}` -> float32 logits
    `[B, T, vocabulary_size]`. Like keras-hub's RWKV-7 backbone it ends in the
    language-model head, so `keras_hub.models.Backbone.from_preset(run_dir)`
    gives the whole trained network. The layers and their names are those of
    `elita_tf.models.build_decoder`; `docs/math.md` writes out every block.

    Args:
        vocabulary_size: int. Size of the token vocabulary.
        num_layers: int. Number of blocks.
        num_heads: int. Heads per attention layer.
        hidden_dim: int. Model width.
        head_dim: int. Width per head (ELiTA values, linear attention, Transformer).
        max_sequence_length: int. The positions the finite buffers hold:
            learned position tables, key/value buffers and 3Lin's wide layers.
            Models without any of those (ELiTA without learned positions)
            generate past it.
        position_scale: int or None. ELiTA's position scale, the length its
            sinusoidal positions span (`u_i = i / (position_scale - 1)`).
            None uses `max_sequence_length`.
        position_mode: `"fixed"` or `"clamped"`: ELiTA's positions past
            `position_scale` run on, or read as the last one (see `Attention2`).
        blocks: str, or one str per layer: `"elita"`, `"transformer"`,
            `"simplified"`, `"linear"`, `"3lin"` or `"additive"`.
        ffn: `"feedforward2"`, `"mlp"`, `"wide"` (One Wide FFN) or `"none"`.
        ffn_factor: int. `FeedForward2`'s second branch width.
        position_dim: int. Sinusoid components of ELiTA's position terms.
        position_embedding: bool. Add learned absolute position embeddings.
        windows: None or one window (int or None) per layer, for additive and 3Lin blocks.
        dropout: float. Residual dropout.
        tied_embeddings: bool. The head uses the token embedding matrix.
        norm_epsilon, embedding_norm, final_norm, scaled_tied_logits, ffn_bias,
            ffn_init_stddev, first_value_projection: the settings that run a
            recipe as its original authors did (`DecoderConfig`;
            `docs/differences.md`).
        dtype: optional dtype policy of every layer (e.g. `"mixed_bfloat16"`).

    Every projection is a Keras `Dense` or `EinsumDense` layer, so
    `quantize("int8")` covers them all and `enable_lora(rank)` adapts them
    all (`default_lora_layer_names`); the documented weights stay reachable
    by name (`backbone.get_layer("block_0").mixer.k1` is ELiTA's `k1` kernel).

    Example:
    >>> backbone = ElitaBackbone.from_architecture("elita", vocabulary_size=100, num_layers=2, hidden_dim=32)
    >>> backbone({"token_ids": tf.ones([2, 8], tf.int32), "padding_mask": tf.ones([2, 8], tf.int32)}).shape
    TensorShape([2, 8, 100])
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers=6,
        num_heads=4,
        hidden_dim=64,
        head_dim=16,
        max_sequence_length=256,
        position_scale=None,
        position_mode="fixed",
        blocks="elita",
        ffn="feedforward2",
        ffn_factor=8,
        position_dim=16,
        position_embedding=False,
        windows=None,
        dropout=0.0,
        tied_embeddings=False,
        norm_epsilon=None,
        embedding_norm=False,
        final_norm=True,
        scaled_tied_logits=False,
        ffn_bias=True,
        ffn_init_stddev=None,
        first_value_projection=False,
        dtype=None,
        **kwargs,
    ):
        config = DecoderConfig(
            vocab_size=vocabulary_size,
            width=hidden_dim,
            num_layers=num_layers,
            num_heads=num_heads,
            head_dim=head_dim,
            context_length=max_sequence_length,
            position_scale=position_scale,
            position_mode=position_mode,
            blocks=blocks,
            ffn=ffn,
            ffn_factor=ffn_factor,
            position_dim=position_dim,
            position_embedding=position_embedding,
            windows=windows,
            dropout=dropout,
            tied_embeddings=tied_embeddings,
            norm_epsilon=norm_epsilon,
            embedding_norm=embedding_norm,
            final_norm=final_norm,
            scaled_tied_logits=scaled_tied_logits,
            ffn_bias=ffn_bias,
            ffn_init_stddev=ffn_init_stddev,
            first_value_projection=first_value_projection,
        )
        # Layers take the global policy when made and built: set it to `dtype` meanwhile,
        # so that sublayers made inside the blocks follow it too.
        previous_policy = keras.config.dtype_policy()
        if dtype is not None:
            keras.config.set_dtype_policy(dtype)
        try:
            layers = make_layers(config)
            token_ids = keras.Input((None,), dtype="int32", name="token_ids")
            padding_mask = keras.Input((None,), dtype="int32", name="padding_mask")
            logits = decoder_forward(config, layers, token_ids, keras.ops.cast(padding_mask, "bool"))
        finally:
            keras.config.set_dtype_policy(previous_policy)
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask}, outputs=logits, dtype=dtype, **kwargs
        )
        self.decoder_config = config
        self.decoder_layers = layers
        self.token_embedding = layers["embedding"]

    @property
    def vocabulary_size(self):
        return self.decoder_config.vocab_size

    @property
    def num_layers(self):
        return self.decoder_config.num_layers

    @property
    def hidden_dim(self):
        return self.decoder_config.width

    @property
    def max_sequence_length(self):
        return self.decoder_config.context_length

    def get_config(self):
        config = super().get_config()
        decoder = self.decoder_config.get_config()
        config.update(
            {
                "vocabulary_size": decoder.pop("vocab_size"),
                "hidden_dim": decoder.pop("width"),
                "max_sequence_length": decoder.pop("context_length"),
                **decoder,
            }
        )
        return config

    def default_lora_layer_names(self):
        """Every projection of every block (not the embedding or the head): `enable_lora(rank)` adapts them all."""
        return [
            *("k1", "k2", "k3", "query", "key", "value", "output", "attention_output"),  # token mixers
            *("query_key", "query_value", "combiner"),  # 3Lin
            *("w1", "w2", "w3", "inner", "outer"),  # feed-forward networks
        ]

    @classmethod
    def from_decoder_config(cls, config, **kwargs):
        """The backbone of a `DecoderConfig` (or its dict), e.g. a training run's."""
        if isinstance(config, dict):
            config = DecoderConfig.from_config(config)
        decoder = config.get_config()
        return cls(
            vocabulary_size=decoder.pop("vocab_size"),
            hidden_dim=decoder.pop("width"),
            max_sequence_length=decoder.pop("context_length"),
            **decoder,
            **kwargs,
        )

    @classmethod
    def from_architecture(cls, name, vocabulary_size, **overrides):
        """One of the recipes (`elita_tf.models.PRESETS`), randomly initialised, with overrides.

        Example:
        >>> ElitaBackbone.from_architecture("transformer", vocabulary_size=100, num_layers=2).num_layers
        2
        """
        if name not in PRESETS:
            raise ValueError(f"Unknown architecture. Expected one of {sorted(PRESETS)}. Received: name={name!r}")
        return cls(vocabulary_size=vocabulary_size, **{**PRESETS[name], **overrides})
