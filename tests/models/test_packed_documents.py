"""Packed documents (`document_starts` without a cache): every architecture gives each document what it gives it alone."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from elita_tf.data import lm_dataset
from elita_tf.data.pipeline import ArraySequences
from elita_tf.models import ARCHITECTURES, ElitaBackbone, ElitaCausalLM

SIZE = {"vocabulary_size": 30, "hidden_dim": 16, "num_layers": 2, "num_heads": 2, "head_dim": 8}
# Every recipe but the one whose positions move with the sequence's length; additive also windowed.
PACKABLE = {name: {} for name in sorted(ARCHITECTURES) if name != "elita-reference"}
PACKABLE["additive-windowed"] = {"sliding_window_sizes": [8, None]}


def _backbone(name):
    keras.utils.set_random_seed(0)
    recipe = "additive" if name == "additive-windowed" else name
    backbone = ElitaBackbone.from_architecture(recipe, max_sequence_length=64, **SIZE, **PACKABLE[name])
    rng = np.random.default_rng(0)
    for w in backbone.weights:  # zero-initialised parts (3Lin's Combiner, queries, pooling) made live
        if np.all(w.numpy() == 0) and len(w.shape) > 0 and "bias" not in w.path and "beta" not in w.path:
            w.assign(rng.normal(size=w.shape) * 0.3)
    return backbone


def _documents():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 30, size=(2, 40)).astype("int32")
    document_starts = np.zeros((2, 40), bool)
    document_starts[0, [0, 9, 10, 33]] = True  # a one-token document at 9
    document_starts[1, [17, 35]] = True
    return tokens, document_starts


def _bounds(document_starts, row):
    starts = sorted({0, *np.flatnonzero(document_starts[row])}) + [document_starts.shape[1]]
    return list(zip(starts[:-1], starts[1:]))


@pytest.mark.parametrize("name", sorted(PACKABLE))
def test_each_packed_document_gets_the_logits_it_gets_alone_also_under_xla(name):
    backbone = _backbone(name)
    tokens, document_starts = _documents()
    causal_lm = ElitaCausalLM(backbone)
    inputs = {"token_ids": tokens, "padding_mask": np.ones_like(tokens), "document_starts": document_starts}
    packed = causal_lm(inputs).numpy()
    compiled = tf.function(lambda x: causal_lm(x), jit_compile=True)(inputs).numpy()
    for row in range(2):
        for a, b in _bounds(document_starts, row):
            alone = tokens[row : row + 1, a:b]
            alone = backbone({"token_ids": alone, "padding_mask": np.ones_like(alone)}).numpy()[0]
            np.testing.assert_allclose(packed[row, a:b], alone, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(compiled[row, a:b], alone, rtol=1e-4, atol=1e-4)


def test_the_loss_leaves_out_each_documents_first_token():
    """A packed batch's loss is the mean over every predicted token of each document run alone,
    with no loss on a document's first token (nothing of its document comes before it)."""
    backbone = _backbone("transformer")
    ids = np.random.default_rng(2).integers(0, 30, size=82).astype("int32")
    starts = np.zeros(82, bool)
    starts[[0, 5, 6, 30, 41, 50, 79]] = True  # 41 is the first token of the second sequence
    sequences, sequence_starts = ids[:82].reshape(2, 41), starts[:82].reshape(2, 41)  # packed, back to back
    packed = ArraySequences(sequences, sequence_starts)
    (x, labels, weights) = next(iter(lm_dataset(packed, 2, shuffle=False, document_starts=True)))
    np.testing.assert_array_equal(x["document_starts"][:, 0], True)
    np.testing.assert_array_equal(weights.numpy() == 0, sequence_starts[:, 1:])

    total, count = 0.0, 0
    for row in range(2):
        sequence = sequences[row]
        bounds = sorted({0, *np.flatnonzero(sequence_starts[row])}) + [41]
        for a, b in zip(bounds[:-1], bounds[1:]):
            document = sequence[a:b][None]  # targets within the document only
            if document.shape[1] < 2:
                continue
            logits = backbone({"token_ids": document[:, :-1], "padding_mask": np.ones_like(document[:, :-1])})
            losses = keras.losses.sparse_categorical_crossentropy(document[:, 1:], logits, from_logits=True)
            total, count = total + float(tf.reduce_sum(losses)), count + document.shape[1] - 1
    assert count == int(weights.numpy().sum())

    causal_lm = ElitaCausalLM(backbone)
    causal_lm.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight"),
        weighted_metrics=None,
    )
    evaluated = causal_lm.evaluate(x, labels, sample_weight=weights, verbose=0)
    trained = causal_lm.train_on_batch(x, labels, sample_weight=weights)
    np.testing.assert_allclose([evaluated, float(np.ravel(trained)[0])], total / count, rtol=1e-5)
