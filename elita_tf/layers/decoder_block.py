import keras

from elita_tf.layers.causal_mixer import CausalMixer
from elita_tf.checks import check_choice, check_dropout
from elita_tf.layers.checks import as_sequence, check_sequence_call, take_arguments_as_given
from elita_tf.layers.options import NORMS, RESIDUALS
from elita_tf.layers.outer_epsilon_rms_normalization import OuterEpsilonRMSNormalization
from elita_tf.layers.renamed_arguments import upgrade_arguments
from elita_tf.layers.short_convolution import ShortConvolution
from elita_tf.layers.unscaled_layer_norm import UnscaledLayerNormalization
from elita_tf.private_apis import global_state
from elita_tf.renames import accepts_renamed_arguments


@keras.saving.register_keras_serializable(package="elita_tf")
class DecoderBlock(keras.layers.Layer):
    """One decoder block: a token mixer and an optional feed-forward network, with norms and residuals.

    Every block of every architecture here is one of these, with `n`, `n2`
    the block's norms (the identity for `norm=None`), `M` the mixer, `F` the
    feed-forward network and `g_M`, `g_F` trainable scalar gains:

        "pre_norm"    h = x + M(n(x));          y = h + F(n2(h))
        "parallel"    y = g_M M(n(x)) + g_F F(n(x))          (no skip: SAS-P)
        "sequential"  h = g_M M(n(x));          y = h + g_F F(n2(h))   (SAS)

    With `short_convolution` (a `ShortConvolution`, `S`) the mixer reads
    `M(S(n(x)))`: each position sees its last few neighbours first, as Based
    and the recurrent models that recall do it; the FFN still reads `n(x)`.

    The skip-less forms are the Simplified Transformer's: the identity path
    lives inside shaped attention (its `α I`), and `g_F` starts small.
    Without `ffn` the second half is left out. Dropout, when set, is applied
    to both branches before they are added.

    Recipes (`elita_tf.models.decoder_layers.make_layers` builds them):

        ELiTA        DecoderBlock(Attention2, FeedForward2, "unscaled_layer_norm")
        Transformer  DecoderBlock(CausalSelfAttention, MLP gelu 4d, "layer_norm")
        SAS-P        DecoderBlock(ShapedAttention, MLP relu 4d, "rms_norm", "parallel")
        3Lin         DecoderBlock(TriLinearAttention, norm=None)   (it normalises itself)

    `ffn` may be one layer shared by several blocks (the One Wide FFN):
    Keras then holds its weights once, also through `.keras` save and load.
    The block's decoding cache is its mixer's, with the short convolution's
    `convolution_inputs` beside it.

    Args:
        mixer: a `CausalMixer` (`Attention2`, `LinearAttention`, ...).
        ffn: optional position-wise layer `[B, T, d] -> [B, T, d]`.
        norm: `"layer_norm"`, `"unscaled_layer_norm"` (no scale or centre),
            `"rms_norm"` (Keras': `x / sqrt(mean(x²) + ε)`),
            `"rms_norm_outer_epsilon"` (`x / (sqrt(mean(x²)) + ε)`, the
            Simplified Transformer's code) or None. Defaults to `"layer_norm"`.
        residual: `"pre_norm"`, `"parallel"` or `"sequential"`. Defaults to
            `"pre_norm"`.
        layer_norm_epsilon: float. Defaults to `1e-5`.
        dropout: float in `[0, 1)`. Dropout on the mixer's and the FFN's outputs, before
            each joins the residual stream. Defaults to `0.0`.
        mixer_gain: float. Initial `g_M` (skip-less forms). Defaults to `1.0`.
        ffn_gain: float. Initial `g_F` (skip-less forms). Defaults to `0.1`.
        short_convolution: optional `ShortConvolution` before the mixer.
            Defaults to `None`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[B, T, d]`.
        padding_mask: optional bool `[B, T]`, False at padding. Defaults to
            the Keras mask.
        cache: optional dict from `get_initial_cache` or a previous call.
        training: bool, for dropout.

    Returns:
        `outputs [B, T, d]`, or `(outputs, new_cache)` when a cache is passed.

    Example:
    >>> from elita_tf.layers import Attention2, FeedForward2
    >>> block = DecoderBlock(Attention2(4, 16, 8), FeedForward2(), norm="unscaled_layer_norm")
    >>> keras.ops.shape(block(keras.ops.zeros((2, 10, 32))))
    (2, 10, 32)
    """

    @accepts_renamed_arguments
    def __init__(
        self,
        mixer,
        ffn=None,
        norm="layer_norm",
        residual="pre_norm",
        layer_norm_epsilon=1e-5,
        dropout=0.0,
        mixer_gain=1.0,
        ffn_gain=0.1,
        short_convolution=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        take_arguments_as_given(self)
        if not isinstance(mixer, CausalMixer):
            raise TypeError(
                f"`mixer` must be a CausalMixer layer (Attention2, LinearAttention, ...). Received: mixer={mixer!r}"
            )
        if short_convolution is not None and not isinstance(short_convolution, ShortConvolution):
            raise TypeError(
                f"`short_convolution` must be a ShortConvolution layer or None. "
                f"Received: short_convolution={short_convolution!r}"
            )
        if ffn is not None and not isinstance(ffn, keras.layers.Layer):
            raise TypeError(f"`ffn` must be a Keras layer or None. Received: ffn={ffn!r}")
        check_choice("norm", norm, (*NORMS, None))
        check_choice("residual", residual, RESIDUALS)
        check_dropout("dropout", dropout)
        self.mixer = mixer
        self.ffn = ffn
        self.norm = norm
        self.residual = residual
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.dropout = float(dropout)
        self.mixer_gain = float(mixer_gain)
        self.ffn_gain = float(ffn_gain)
        self.short_convolution = short_convolution

    def __call__(self, inputs, *args, **kwargs):
        return super().__call__(as_sequence(inputs), *args, **kwargs)

    def _make_norm(self, name):
        sub = {"epsilon": self.layer_norm_epsilon, "name": name, "dtype": self.dtype_policy}
        if self.norm == "rms_norm":
            norm = keras.layers.RMSNormalization(**sub)
            # It acts on each position alone, so a Keras mask passes through it; Keras' layer does not
            # say so, and warns that it drops the mask.
            norm.supports_masking = True
            return norm
        if self.norm == "rms_norm_outer_epsilon":
            return OuterEpsilonRMSNormalization(**sub)
        if self.norm == "unscaled_layer_norm":
            return UnscaledLayerNormalization(**sub)
        return keras.layers.LayerNormalization(**sub)

    def build(self, inputs_shape):
        self.mixer_norm = self.ffn_norm = None
        if self.norm is not None:
            self.mixer_norm = self._make_norm("mixer_norm")
            self.mixer_norm.build(inputs_shape)
            # The parallel form feeds both branches the same normalised input.
            if self.ffn is not None and self.residual != "parallel":
                self.ffn_norm = self._make_norm("ffn_norm")
                self.ffn_norm.build(inputs_shape)
        if self.short_convolution is not None and not self.short_convolution.built:
            self.short_convolution.build(inputs_shape)
        if not self.mixer.built:
            self.mixer.build(inputs_shape)
        if self.ffn is not None and not self.ffn.built:  # a shared FFN is built once
            self.ffn.build(inputs_shape)
        self.branch_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        if self.residual != "pre_norm":
            gain = lambda name, value: self.add_weight(  # noqa: E731
                name=name, shape=(), initializer=keras.initializers.Constant(value), dtype=self.variable_dtype
            )
            self.mixer_scale = gain("mixer_gain", self.mixer_gain)
            if self.ffn is not None:
                self.ffn_scale = gain("ffn_gain", self.ffn_gain)
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: inputs_shape[-1]})

    @accepts_renamed_arguments
    def call(self, inputs, padding_mask=None, cache=None, training=None, mask=None, document_starts=None):
        # The mixer checks the cache and contains non-finite inputs; everything else is position-wise.
        inputs, padding_mask = check_sequence_call(self, inputs, mask if padding_mask is None else padding_mask)
        normed = self.mixer_norm(inputs) if self.mixer_norm is not None else inputs
        extra = {} if document_starts is None else {"document_starts": document_starts}
        mixer_inputs, convolution_cache = normed, {}
        if self.short_convolution is not None and cache is None:
            mixer_inputs = self.short_convolution(normed, padding_mask=padding_mask, **extra)
        elif self.short_convolution is not None:
            names, convolution_cache = self.short_convolution.cache_names, cache  # not a dict: refused by its check
            if isinstance(cache, dict):
                convolution_cache = {name: value for name, value in cache.items() if name in names}
                cache = {name: value for name, value in cache.items() if name not in names}
            mixer_inputs, convolution_cache = self.short_convolution(
                normed, padding_mask=padding_mask, cache=convolution_cache, **extra
            )
        if cache is None:
            mixed = self.mixer(mixer_inputs, padding_mask=padding_mask, training=training, **extra)
        else:
            mixed, cache = self.mixer(mixer_inputs, padding_mask=padding_mask, cache=cache, training=training, **extra)
            cache = {**cache, **convolution_cache}
        mixed = self.branch_dropout(mixed, training=training)

        if self.residual == "pre_norm":
            outputs = inputs + mixed
            if self.ffn is not None:
                ffn_inputs = self.ffn_norm(outputs) if self.ffn_norm is not None else outputs
                outputs = outputs + self.branch_dropout(self.ffn(ffn_inputs), training=training)
        else:
            outputs = self.mixer_scale * mixed
            if self.ffn is not None:
                if self.residual == "parallel":
                    ffn_inputs = normed
                else:
                    ffn_inputs = self.ffn_norm(outputs) if self.ffn_norm is not None else outputs
                outputs = outputs + self.ffn_scale * self.branch_dropout(self.ffn(ffn_inputs), training=training)
        return outputs if cache is None else (outputs, cache)

    @property
    def cache_names(self):
        """The names of the decoding cache's tensors: the mixer's, then the short convolution's."""
        convolution = () if self.short_convolution is None else self.short_convolution.cache_names
        return (*self.mixer.cache_names, *convolution)

    def get_initial_cache(self, batch_size, dtype=None):
        """The mixer's cache (`mixer.get_initial_cache`), and the short convolution's."""
        if not self.mixer.built:
            raise ValueError(f"Layer '{self.name}' needs its input width: build or call it before `get_initial_cache`.")
        cache = self.mixer.get_initial_cache(batch_size, dtype)
        if self.short_convolution is not None:
            cache.update(self.short_convolution.get_initial_cache(batch_size, dtype))
        return cache

    def _serialized_ffn(self):
        if self.ffn is None:
            return None
        config = keras.saving.serialize_keras_object(self.ffn)
        # While saving, Keras marks an object met twice as shared in the config it returns, but the
        # first block's copy of its config has already been taken by then. Marking the FFN by
        # identity in every block makes a shared FFN load as one layer again.
        if global_state.get_global_attribute("shared_objects/id_to_config_map") is not None:
            config["shared_object_id"] = id(self.ffn)
        return config

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "mixer": keras.saving.serialize_keras_object(self.mixer),
                "ffn": self._serialized_ffn(),
                "norm": self.norm,
                "residual": self.residual,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "dropout": self.dropout,
                "mixer_gain": self.mixer_gain,
                "ffn_gain": self.ffn_gain,
                "short_convolution": None
                if self.short_convolution is None
                else keras.saving.serialize_keras_object(self.short_convolution),
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        import elita_tf.layers as package

        # The package loads lazily: every layer class registered, the mixer and FFN a config names load.
        for name in package.__all__:
            getattr(package, name)
        config = upgrade_arguments(cls.__name__, config)  # a `.keras` file of elita-tf 0.1.0
        config["mixer"] = keras.saving.deserialize_keras_object(config["mixer"])
        for part in ("ffn", "short_convolution"):
            if config.get(part) is not None:
                config[part] = keras.saving.deserialize_keras_object(config[part])
        return cls(**config)

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, inputs_shape):
        return inputs_shape
