import collections
import os

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from elita_tf.data import (
    lm_dataset,
    load_wikitext,
    split_files,
    train_sentencepiece,
)
from elita_tf.data.corpus_settings import CorpusSettings
from elita_tf.data.pipeline import line_ids
from elita_tf.data.token_files import FileSequences
from elita_tf.data.tokenizer import MAX_SENTENCE_BYTES, MIN_BYTE_FALLBACK_VOCABULARY, cut_long_line
from elita_tf.models import ElitaTokenizer
from tests.conftest import WORDS, rare_character_lines, token_file, write_tiny_wikitext


@pytest.fixture(scope="module")
def splits(tiny_wikitext, tmp_path_factory):
    return load_wikitext("wikitext-2-v1", local_dir=tiny_wikitext, tfds_dir=str(tmp_path_factory.mktemp("tfds")))


@pytest.fixture(scope="module")
def proto(splits):
    lines = [line.decode() for line in splits["train"].as_numpy_iterator()]
    return train_sentencepiece(lines, vocabulary_size=60)


@pytest.fixture(scope="module")
def tokenizer(proto):
    return ElitaTokenizer(proto=proto)


@pytest.fixture(scope="module")
def sequences(splits, tokenizer, tmp_path_factory):
    """The training split's sequences of 17 tokens, on disk as `elita-train` reads them."""
    return FileSequences(token_file(splits["train"], tokenizer, tmp_path_factory.mktemp("tokens") / "train"), 17)


def test_builder_reads_local_files_in_order(splits, tiny_wikitext):
    with open(os.path.join(tiny_wikitext, "wiki.train.tokens"), encoding="utf-8") as f:
        want = [line.strip() for line in f if line.strip()]
    got = [line.decode() for line in splits["train"].as_numpy_iterator()]
    assert got == want  # every non-empty line, file order kept
    assert set(splits) == {"train", "validation", "test"}


def test_missing_or_empty_data_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="wiki.train.tokens"):
        split_files(str(tmp_path), "wikitext-2-v1")
    empty = write_tiny_wikitext(str(tmp_path / "empty"), lines_per_split=(0, 5, 5))
    open(os.path.join(empty, "wiki.train.tokens"), "w").close()
    with pytest.raises(ValueError, match="train split is empty"):
        load_wikitext("wikitext-2-v1", local_dir=empty, tfds_dir=str(tmp_path / "tfds"))
    with pytest.raises(ValueError, match="Unknown WikiText config"):
        split_files(str(tmp_path), "wikitext-5")


def test_tokenizer_round_trip_in_graph(tokenizer):
    text = tf.constant(["the cat sees the bridge .", "a dog likes an apple ."])
    ids = tf.function(lambda lines: line_ids(tokenizer, lines))(text)
    assert ids.dtype == tf.int32 and [row[-1] for row in ids.to_list()] == [tokenizer.end_token_id] * 2
    assert line_ids(tokenizer, text).to_list() == ids.to_list()  # eagerly too
    assert np.all(ids.flat_values.numpy() < 60)
    assert [s.decode() for s in tf.function(tokenizer.detokenize)(ids).numpy()] == [s.decode() for s in text.numpy()]


def test_a_corpus_whose_characters_fit_has_no_byte_pieces(proto):
    pieces = sentencepiece.SentencePieceProcessor(model_proto=proto)
    assert pieces.get_piece_size() == 60 and not any(pieces.is_byte(i) for i in range(60))


def test_a_small_vocabulary_spells_rare_characters_in_bytes():
    lines = rare_character_lines(200)
    assert len(set("".join(lines))) > 300
    proto = train_sentencepiece(lines, vocabulary_size=300)
    pieces = sentencepiece.SentencePieceProcessor(model_proto=proto)
    assert pieces.get_piece_size() == 300 and sum(pieces.is_byte(i) for i in range(300)) == 256
    text = lines[:20] + ["ж 𝄞 ☃ ∮ 丂 new characters ."]  # and characters the corpus never had
    # In the tf.data graph: byte pieces, never <unk>, and the text back whole.
    tokenizer = ElitaTokenizer(proto=proto)
    ids = tf.data.Dataset.from_tensor_slices(text).batch(len(text)).map(lambda lines: line_ids(tokenizer, lines))
    ids = next(iter(ids)).to_list()
    assert ids == [row + [pieces.eos_id()] for row in pieces.encode(text)]
    flat = [i for row in ids for i in row]
    assert pieces.unk_id() not in flat and any(pieces.is_byte(i) for i in flat)
    assert [t.decode() for t in tf.function(tokenizer.detokenize)(tf.ragged.constant(ids)).numpy()] == text
    # keras-hub's tokenizer, the model's and its presets'.
    keras_hub_tokenizer = ElitaTokenizer(proto=proto)
    assert keras_hub_tokenizer(text) == pieces.encode(text)
    assert keras_hub_tokenizer.detokenize(keras_hub_tokenizer(text)) == text
    # The smallest vocabulary with byte pieces trains; one below it is refused with the size to use.
    assert sentencepiece.SentencePieceProcessor(
        model_proto=train_sentencepiece(lines, vocabulary_size=MIN_BYTE_FALLBACK_VOCABULARY)
    ).get_piece_size() == MIN_BYTE_FALLBACK_VOCABULARY
    below = MIN_BYTE_FALLBACK_VOCABULARY - 1
    message = rf"byte pieces.*use at least {MIN_BYTE_FALLBACK_VOCABULARY}\. Received: vocabulary_size={below}$"
    with pytest.raises(ValueError, match=message):
        train_sentencepiece(lines, vocabulary_size=below)
    # Where every character fits with the special pieces, that is the smaller size named.
    with pytest.raises(ValueError, match=r"use at least 24\. Received: vocabulary_size=10$"):
        train_sentencepiece(["α β γ δ ε ζ η θ ι κ λ μ ν ξ ο π ρ σ τ υ"] * 30, vocabulary_size=10)


def test_the_smallest_vocabulary_sentencepiece_trains_and_one_below_it():
    # Its 3 special pieces, the word boundary and the one character of the text.
    proto = train_sentencepiece(["a a a"] * 20, vocabulary_size=5)
    assert sentencepiece.SentencePieceProcessor(model_proto=proto).get_piece_size() == 5
    for size in (1, 2, 4):  # SentencePiece's own error for 1 and 2 is a RuntimeError from inside its trainer
        with pytest.raises(ValueError, match=rf"must be an integer >= 5: .* Received: vocabulary_size={size}$"):
            train_sentencepiece(["a a a"] * 20, vocabulary_size=size)


def test_vocabulary_too_large_and_empty_corpus():
    with pytest.raises(ValueError, match="too small for a vocabulary of 100000 pieces: use at most"):
        train_sentencepiece(["the cat sees the dog ."] * 50, vocabulary_size=100000)
    with pytest.raises(ValueError, match="empty"):
        train_sentencepiece(["", "  "], vocabulary_size=10)


def test_windows_and_batches(splits, sequences, proto):
    first, _ = sequences.rows([0])
    assert first.shape == (1, 17) and first.dtype == np.int32
    pieces = sentencepiece.SentencePieceProcessor(model_proto=proto)
    lines = [line.decode() for line in splits["train"].take(3).as_numpy_iterator()]
    ids = np.concatenate([pieces.encode(line) + [pieces.eos_id()] for line in lines])
    np.testing.assert_array_equal(first[0], ids[:17])  # concatenated in order, eos per line
    x, y = next(iter(lm_dataset(sequences, batch_size=4, seed=0)))
    assert x["token_ids"].shape == (4, 16) and y.shape == (4, 16)
    np.testing.assert_array_equal(x["padding_mask"], np.ones((4, 16)))
    np.testing.assert_array_equal(x["token_ids"][:, 1:], y[:, :-1])


def test_batches_are_deterministic_and_resume_exactly(sequences):
    stream = lambda **kw: [x["token_ids"].numpy() for x, _ in lm_dataset(sequences, 4, epochs=3, **kw)]  # noqa: E731
    a, b, other = stream(seed=1), stream(seed=1), stream(seed=2)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not all(np.array_equal(p, q) for p, q in zip(a, other))
    resumed = stream(seed=1, start_step=7)
    assert len(resumed) == len(a) - 7 and all(np.array_equal(p, q) for p, q in zip(a[7:], resumed))
    per_epoch = len(sequences) // 4
    first, second = a[:per_epoch], a[per_epoch : 2 * per_epoch]
    assert not all(np.array_equal(p, q) for p, q in zip(first, second))  # reshuffled each epoch
    available = collections.Counter(bytes(row) for row in sequences.rows(range(len(sequences)))[0][:, :-1])
    for epoch in (first, second):  # each sequence at most once an epoch
        used = collections.Counter(bytes(row) for row in np.concatenate(epoch))
        assert sum(used.values()) == per_epoch * 4 and not used - available


def test_shards_of_a_step_make_up_its_global_batch(sequences):
    stream = lambda **kw: [  # noqa: E731
        x["token_ids"].numpy() for x, _ in lm_dataset(sequences, 6, seed=3, epochs=2, start_step=2, **kw)
    ]
    whole = stream()
    shards = [stream(shard=i, num_shards=3) for i in range(3)]
    assert all(len(part) == len(whole) for part in shards)
    for step, batch in enumerate(whole):
        assert all(part[step].shape == (2, 16) for part in shards)
        np.testing.assert_array_equal(np.concatenate([part[step] for part in shards]), batch)
    with pytest.raises(ValueError, match="batch_size=6, shard=0, num_shards=4"):
        lm_dataset(sequences, 6, num_shards=4)


def test_lines_longer_than_sentencepiece_reads_are_cut_for_its_sample_only():
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS + ["café"], 1000)) for _ in range(20)]  # ~6,000 bytes each, one a document
    tokenizer = ElitaTokenizer(proto=train_sentencepiece(lines, vocabulary_size=60))
    assert tokenizer.detokenize(tokenizer.tokenize(lines[0])) == lines[0]  # the text stays whole
    assert min(len(line.encode()) for line in lines) > MAX_SENTENCE_BYTES
    # Pieces end at whitespace where there is some, and never inside a UTF-8 character where there is none.
    pieces = cut_long_line(lines[0])
    assert " ".join(pieces) == lines[0] and all(len(p.encode()) <= MAX_SENTENCE_BYTES for p in pieces)
    solid = "é" * 5000 + "x"
    pieces = cut_long_line(solid)
    assert "".join(pieces) == solid and all(0 < len(p.encode()) <= MAX_SENTENCE_BYTES for p in pieces)
    assert cut_long_line("short") == ["short"]


def test_the_wikitext_tfds_builder_reads_elita_wikitext_dir(tmp_path, monkeypatch):
    from elita_tf.data import corpus, wikitext

    def no_network(*args):
        raise AssertionError("the builder downloaded WikiText although ELITA_WIKITEXT_DIR holds it")

    local = write_tiny_wikitext(str(tmp_path / "local"), lines_per_split=(40, 10, 10))
    monkeypatch.setenv("ELITA_WIKITEXT_DIR", local)
    monkeypatch.setattr(wikitext, "fetch_wikitext", no_network)
    splits, info = corpus.load_corpus(CorpusSettings("tfds:wikitext/wikitext-2-v1", tfds_dir=str(tmp_path / "tfds")))
    with open(os.path.join(local, "wiki.valid.tokens"), encoding="utf-8") as f:
        want = [line.strip() for line in f if line.strip()]
    assert [line.decode() for line in splits["validation"].as_numpy_iterator()] == want
    assert info["source"] == "tfds:wikitext/wikitext-2-v1/1.0.0"
