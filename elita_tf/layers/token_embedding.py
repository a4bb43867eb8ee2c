import keras
import tensorflow as tf

from elita_tf.layers.checks import check_token_ids


@keras.saving.register_keras_serializable(package="elita_tf")
class TokenEmbedding(keras.layers.Embedding):
    """Token embeddings that can also produce the output logits (tied weights).

    `call(ids)` embeds integer token ids `[B, T]` to `[B, T, d]`; ids outside
    `[0, input_dim)` are an error (`check_token_ids`), float ids are refused;
    `call(x, reverse=True)` maps `[B, T, d]` to float32 logits `x Eᵀ`
    `[B, T, input_dim]` with the same matrix.

    Args:
        input_dim: int. Number of tokens (the vocabulary size).
        output_dim: int. Embedding width `d`.
        tie_weights: bool. Whether `reverse=True` may be used. Defaults to `True`.
        embeddings_initializer: Defaults to `RandomNormal(stddev=0.02)`.
        **kwargs: other `keras.layers.Embedding` arguments.

    Example:
    >>> embed = TokenEmbedding(100, 16)
    >>> logits = embed(embed(tf.constant([[1, 2, 3]])), reverse=True)
    >>> logits.shape
    TensorShape([1, 3, 100])
    """

    def __init__(self, input_dim, output_dim, tie_weights=True, embeddings_initializer=None, **kwargs):
        super().__init__(
            input_dim,
            output_dim,
            embeddings_initializer=embeddings_initializer or keras.initializers.RandomNormal(stddev=0.02),
            **kwargs,
        )
        self.tie_weights = bool(tie_weights)

    def call(self, inputs, reverse=False):
        if reverse:
            if not self.tie_weights:
                raise ValueError(f"Layer '{self.name}' was built with tie_weights=False: it has no reverse mode.")
            return tf.matmul(tf.cast(inputs, tf.float32), tf.cast(self.embeddings, tf.float32), transpose_b=True)
        token_ids, in_range = check_token_ids(inputs, self.input_dim)
        embedded = super().call(token_ids)
        # Where the range assertion cannot run (XLA drops it), an out-of-range id embeds to NaN:
        # a gather would clamp it (XLA) or return zeros (GPU), a silent wrong result.
        return tf.where(in_range[..., None], embedded, tf.constant(float("nan"), embedded.dtype))

    def compute_output_spec(self, inputs, reverse=False):
        if reverse:
            return keras.KerasTensor(tuple(inputs.shape[:-1]) + (self.input_dim,), dtype="float32")
        return keras.KerasTensor(tuple(inputs.shape) + (self.output_dim,), dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config["tie_weights"] = self.tie_weights
        return config
