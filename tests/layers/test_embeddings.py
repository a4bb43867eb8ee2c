"""TokenEmbedding and PositionEmbedding on every backend: lookups against NumPy, compiled, saved."""

import keras
import numpy as np
import pytest
from keras import ops

from elita_tf.layers import PositionEmbedding, TokenEmbedding
from tests.backend_utils import BACKEND, compiled, numpy, random_normal, tensor

# A check that fails at run time: raised eagerly on JAX and PyTorch, by the graph on TensorFlow.
if BACKEND == "tensorflow":
    import tensorflow as tf

    RUN_TIME_ERRORS = (ValueError, tf.errors.InvalidArgumentError)
else:
    RUN_TIME_ERRORS = ValueError


def test_token_embedding_embeds_and_reverses_with_one_table():
    embed = TokenEmbedding(11, 4)
    ids = np.array([[1, 2, 3, 10], [0, 0, 5, 7]])
    embedded = numpy(embed(tensor(ids, "int32")))
    table = numpy(embed.embeddings)
    np.testing.assert_array_equal(embedded, table[ids])
    x = random_normal((2, 3, 4), seed=0)
    np.testing.assert_allclose(numpy(embed(x, reverse=True)), numpy(x) @ table.T, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="vocabulary_size=11"):
        embed(tensor([[1, 11]], "int32"))


def test_token_embedding_compiled_and_saved(tmp_path):
    embed = TokenEmbedding(11, 4)
    ids = tensor(np.array([[1, 2, 3, 10], [0, 0, 5, 7]]), "int32")
    want = numpy(embed(ids))
    np.testing.assert_array_equal(numpy(compiled(embed)(ids)), want)
    inputs = keras.Input((None,), dtype="int32")
    model = keras.Model(inputs, embed(embed(inputs), reverse=True))
    path = str(tmp_path / "embed.keras")
    model.save(path)
    np.testing.assert_array_equal(numpy(keras.models.load_model(path)(ids)), numpy(model(ids)))


def test_position_embedding_rows_by_position():
    layer = PositionEmbedding(max_sequence_length=16)
    x = ops.zeros((2, 5, 3))
    layer.build((None, None, 3))
    table = numpy(layer.embeddings)
    np.testing.assert_array_equal(numpy(layer(x)), np.broadcast_to(table[:5], (2, 5, 3)))
    # Decoding: each sequence from its own start; a negative position (left padding) reads row 0.
    got = numpy(layer(x, start_index=tensor(np.array([3, -2]), "int32")))
    np.testing.assert_array_equal(got[0], table[3:8])
    np.testing.assert_array_equal(got[1], table[[0, 0, 0, 1, 2]])
    starts = np.zeros((2, 5), bool)
    starts[0, 2] = True
    got = numpy(layer(x, document_starts=tensor(starts)))
    np.testing.assert_array_equal(got[0], table[[0, 1, 0, 1, 2]])
    np.testing.assert_array_equal(got[1], table[:5])
    with pytest.raises(RUN_TIME_ERRORS, match="max_sequence_length=16"):
        layer(ops.zeros((1, 17, 3)))
    assert tuple(layer(ops.zeros((1, 0, 3))).shape) == (1, 0, 3)


def test_position_embedding_compiled_and_saved(tmp_path):
    layer = PositionEmbedding(max_sequence_length=16)
    x = random_normal((2, 7, 3), seed=1)
    start = tensor(np.array([2, 5]), "int32")
    want = numpy(layer(x, start_index=start))
    np.testing.assert_array_equal(numpy(compiled(lambda x, s: layer(x, start_index=s))(x, start)), want)
    inputs = keras.Input((None, 3))
    model = keras.Model(inputs, inputs + layer(inputs))
    path = str(tmp_path / "positions.keras")
    model.save(path)
    np.testing.assert_array_equal(numpy(keras.models.load_model(path)(x)), numpy(model(x)))
