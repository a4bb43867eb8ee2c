import keras
from keras import ops

from elita_tf import backend
from elita_tf.checks import check_sequence_length
from elita_tf.layers.checks import input_width
from elita_tf.layers.initializers import clone_initializer
from elita_tf.ops.utils.documents import document_positions
from elita_tf.renames import accepts_renamed_arguments


@keras.saving.register_keras_serializable(package="elita_tf")
class PositionEmbedding(keras.layers.Layer):
    """Learned absolute position embeddings for positions `0 .. max_sequence_length - 1`.

    Returns the embeddings of the input's positions (to be added to it):
    `[B, T, d]`, the inputs' shape (per sequence when decoding from `start_index [B]`).

    Args:
        max_sequence_length: int, at least 2. Longest sequence it has positions for.
        initializer: Defaults to `RandomNormal(stddev=0.02)`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: tensor `[B, T, d]`; only its shape is used.
        start_index: optional int or int `[B]`: the position of the first
            input (decoding). Defaults to 0. Negative positions (left padding
            before a prompt) get the embedding of position 0.
        document_starts: optional bool `[B, T]`, True where a document starts: positions
            restart at 0 there (packed documents).

    Example:
    >>> x = keras.ops.zeros((2, 10, 16))
    >>> keras.ops.shape(x + PositionEmbedding(max_sequence_length=256)(x))
    (2, 10, 16)
    """

    def __init__(self, max_sequence_length, initializer=None, **kwargs):
        super().__init__(**kwargs)
        check_sequence_length("max_sequence_length", max_sequence_length)
        self.max_sequence_length = max_sequence_length
        self.initializer = keras.initializers.get(initializer or keras.initializers.RandomNormal(stddev=0.02))

    def build(self, inputs_shape):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_sequence_length, input_width(inputs_shape)),
            initializer=clone_initializer(self.initializer),
            dtype=self.variable_dtype,
        )

    @accepts_renamed_arguments
    def call(self, inputs, start_index=None, document_starts=None):
        length = ops.shape(inputs)[1]
        if start_index is not None:
            start_index = ops.broadcast_to(ops.cast(start_index, "int32"), ops.shape(inputs)[:1])
        positions = document_positions(length, start_index, document_starts)
        # positions < max_sequence_length, integers: at most max_sequence_length - 1. Read only once checked:
        # in a graph the gather past the table would otherwise fail first, with TensorFlow's message.
        checked = backend.check_less_equal(
            ops.max(ops.concatenate([ops.convert_to_tensor([-1], "int32"), ops.reshape(positions, (-1,))], 0)),
            self.max_sequence_length - 1,
            message=(
                f"'{self.name}' has learned positions for sequences of at most "
                f"max_sequence_length={self.max_sequence_length}"
            ),
        )
        positions = backend.ordered([checked], lambda: ops.copy(positions))
        embedded = ops.cast(ops.take(self.embeddings, ops.maximum(positions, 0), axis=0), self.compute_dtype)
        # The inputs' full shape: a [1, 0, d] addend is taken for a bias by oneDNN's Add at T = 0.
        return ops.broadcast_to(embedded, ops.shape(inputs))

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def get_config(self):
        return {
            **super().get_config(),
            "max_sequence_length": self.max_sequence_length,
            "initializer": keras.initializers.serialize(self.initializer),
        }
