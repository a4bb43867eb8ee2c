import keras
from keras import ops

from elita_tf.ops.utils.token_ids import check_token_ids


@keras.saving.register_keras_serializable(package="elita_tf")
class TokenEmbedding(keras.layers.ReversibleEmbedding):
    """Token embeddings that can also produce the output logits (tied weights).

    Keras' `ReversibleEmbedding` (keras-hub's token embedding, so `quantize("int8")`
    covers it) with checked ids: `call(ids)` embeds integer token ids `[B, T]` to
    `[B, T, d]`, ids outside `[0, input_dim)` are an error (`check_token_ids`) and
    float ids are refused; `call(x, reverse=True)` maps `[B, T, d]` to logits
    `x Eᵀ` `[B, T, input_dim]` with the same matrix, in the compute dtype.

    Args:
        input_dim: int. Number of tokens (the vocabulary size).
        output_dim: int. Embedding width `d`.
        embeddings_initializer: Defaults to `RandomNormal(stddev=0.02)`.
        **kwargs: other `keras.layers.ReversibleEmbedding` arguments.

    Example:
    >>> embed = TokenEmbedding(100, 16)
    >>> logits = embed(embed(np.array([[1, 2, 3]])), reverse=True)
    >>> keras.ops.shape(logits)
    (1, 3, 100)
    """

    def __init__(self, input_dim, output_dim, embeddings_initializer=None, **kwargs):
        # An untied head is the model's own `Dense` layer, not a second matrix here; the reverse mode is
        # a plain product in the compute dtype (the model scales or clips its logits itself).
        for option, only in {"tie_weights": True, "reverse_dtype": None, "logit_soft_cap": None}.items():
            value = kwargs.pop(option, only)
            if value != only:
                raise ValueError(f"TokenEmbedding supports only {option}={only!r}. Received: {option}={value!r}")
        super().__init__(
            input_dim,
            output_dim,
            tie_weights=True,
            embeddings_initializer=embeddings_initializer or keras.initializers.RandomNormal(stddev=0.02),
            **kwargs,
        )

    def call(self, inputs, reverse=False):
        if reverse:
            # Embedding tables are not autocast (a gather reads float32): cast the transposed table here.
            kernel = keras.ops.cast(keras.ops.transpose(self.embeddings), self.compute_dtype)
            return keras.ops.matmul(keras.ops.cast(inputs, self.compute_dtype), kernel)
        return self._checked(super().call, inputs)

    def quantized_call(self, inputs, reverse=False):
        # A quantized layer is called here instead of `call`: the same id checks around the int8 lookup.
        if reverse:
            return super().quantized_call(inputs, reverse=True)
        return self._checked(super().quantized_call, inputs)

    def _checked(self, lookup, inputs):
        token_ids, in_range = check_token_ids(inputs, self.input_dim)
        embedded = lookup(token_ids)
        # Where the range assertion cannot run (XLA drops it), an out-of-range id embeds to NaN:
        # a gather would clamp it (XLA) or return zeros (GPU), a silent wrong result.
        return ops.where(in_range[..., None], embedded, ops.cast(float("nan"), embedded.dtype))

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras refuses subclasses unless they opt in: the quantized call is the parent's.
        super().quantize(mode, type_check=False, config=config)
