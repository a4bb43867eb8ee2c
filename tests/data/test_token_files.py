"""Splits tokenized once into files on disk: SentencePiece's own stream, cut and batched as NumPy would, reused,
never loaded whole."""

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from elita_tf.data import lm_dataset, load_corpus, train_sentencepiece
from elita_tf.data.corpus_settings import CorpusSettings
from elita_tf.data.pipeline import ArraySequences
from elita_tf.data.token_files import FileSequences, TokenFile, fingerprint, write_token_file
from elita_tf.models import ElitaTokenizer
from tests.conftest import write_documents


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("texts")
    splits, _ = load_corpus(
        CorpusSettings(write_documents(folder, 40, seed=0), holdout_fraction=0.1), document_starts=True
    )
    lines = [line.decode() for line, _ in splits["train"].as_numpy_iterator()]
    return splits, ElitaTokenizer(proto=train_sentencepiece(lines, vocabulary_size=50))


def _reference_stream(split, tokenizer):
    """`(ids, starts)` of a split by SentencePiece itself: each line's pieces and its end-of-line id, in order,
    True at the first token of each line that starts a document."""
    pieces = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.proto)
    ids, starts = [], []
    for line, starts_document in split.as_numpy_iterator():
        line_ids = pieces.encode(line.decode()) + [pieces.eos_id()]
        ids += line_ids
        starts += [bool(starts_document)] + [False] * (len(line_ids) - 1)
    return np.array(ids, np.int32), np.array(starts)


def _batches(dataset):
    return [tuple(np.asarray(part) if not isinstance(part, dict) else part["token_ids"] for part in batch)
            for batch in dataset.as_numpy_iterator()]  # fmt: skip


def test_files_hold_the_stream_and_give_the_batches_memory_gives(corpus, tmp_path):
    splits, tokenizer = corpus
    tokens = write_token_file(splits["train"], tokenizer, str(tmp_path / "train"), vocabulary_size=50,
                              lines_per_batch=7)  # fmt: skip
    ids, starts = _reference_stream(splits["train"], tokenizer)
    documents = sum(int(start) for _, start in splits["train"].as_numpy_iterator())
    assert len(tokens) == len(ids) and starts.sum() == documents > 30  # 40 documents, a few held out
    got_ids, got_starts = tokens.read(0, len(tokens))
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(got_starts, starts)
    np.testing.assert_array_equal(tokens.read(100, 17)[0], ids[100:117])

    count = len(ids) // 16  # sequences of 16 tokens, back to back, the last partial one dropped
    in_memory = ArraySequences(ids[: count * 16].reshape(count, 16), starts[: count * 16].reshape(count, 16))
    on_disk = FileSequences(tokens, 16)
    assert len(on_disk) == count
    for got, want in zip(on_disk.rows([3, 0, count - 1]), in_memory.rows([3, 0, count - 1])):
        np.testing.assert_array_equal(got, want)
    # Batches, a resumed stream and a worker's shard: the same either way.
    for kwargs in [{"epochs": 2}, {"epochs": 2, "start_step": 7}, {"shard": 1, "num_shards": 2}]:
        memory = _batches(lm_dataset(in_memory, 8, seed=5, **kwargs))
        disk = _batches(lm_dataset(on_disk, 8, seed=5, **kwargs))
        assert len(memory) == len(disk) > 0
        for a, b in zip(memory, disk):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
    # Packed documents: the files' starts ride along.
    memory = list(lm_dataset(in_memory, 8, seed=5, document_starts=True).as_numpy_iterator())
    disk = list(lm_dataset(on_disk, 8, seed=5, document_starts=True).as_numpy_iterator())
    for (x1, y1, w1), (x2, y2, w2) in zip(memory, disk):
        np.testing.assert_array_equal(x1["document_starts"], x2["document_starts"])
        np.testing.assert_array_equal(w1, w2)
        np.testing.assert_array_equal(y1, y2)


def test_0_1_0_s_cutters_still_cut_through_the_files_for_a_release(corpus, tmp_path):
    import elita_tf.data as data

    splits, tokenizer = corpus
    ids, starts = _reference_stream(splits["train"], tokenizer)
    going = "is deprecated and goes in the next release: write the split's token files"
    with pytest.warns(FutureWarning, match=rf"`elita_tf.data.token_stream` {going} .*tokens.stream\(\)"):
        stream = data.token_stream(splits["train"], tokenizer, vocabulary_size=50)
    np.testing.assert_array_equal(stream[0], ids)
    np.testing.assert_array_equal(stream[1], starts)
    count = len(ids) // 17
    for old in ("token_sequences", "token_windows"):
        with pytest.warns(FutureWarning, match=rf"`elita_tf.data.{old}` {going} .*FileSequences\(tokens, T \+ 1\)"):
            sequences = getattr(data, old)(splits["train"].map(lambda line, _: line), tokenizer, 16)
        np.testing.assert_array_equal(sequences, ids[: count * 17].reshape(count, 17))
    for old in ("packed_sequences", "packed_windows"):
        with pytest.warns(FutureWarning, match=rf"`elita_tf.data.{old}` {going} .*document_starts=True"):
            packed, packed_starts = getattr(data, old)(ids, starts, 16)
        np.testing.assert_array_equal(packed, ids[: count * 17].reshape(count, 17))
        np.testing.assert_array_equal(packed_starts, starts[: count * 17].reshape(count, 17))
    # lm_dataset takes their arrays for the same release: the batches the files give.
    tokens = write_token_file(splits["train"], tokenizer, str(tmp_path / "train"))
    want = _batches(lm_dataset(FileSequences(tokens, 17), 4, seed=3, document_starts=True))
    with pytest.warns(FutureWarning, match="`lm_dataset`'s NumPy sequences are deprecated"):
        got = _batches(lm_dataset(packed, 4, seed=3, document_starts=packed_starts))
    assert len(got) == len(want) == count // 4
    for got_batch, want_batch in zip(got, want):
        for g, w in zip(got_batch, want_batch):
            np.testing.assert_array_equal(g, w)


def test_written_files_are_reused_and_checked_against_the_vocabulary(corpus, tmp_path):
    splits, tokenizer = corpus
    directory = str(tmp_path / fingerprint("text-sha", "tokenizer-sha", "train"))
    first = write_token_file(splits["train"], tokenizer, directory)

    def refuse():
        raise AssertionError("tokenized again")
        yield

    unread = tf.data.Dataset.from_generator(refuse, output_signature=(tf.TensorSpec([], tf.string),) * 1)
    again = write_token_file(unread, tokenizer, directory)  # the files are there: nothing is read
    assert len(again) == len(first) and again.index == first.index
    with pytest.raises(ValueError, match=r"outside the model's vocabulary \[0, 10\)"):
        write_token_file(unread, tokenizer, directory, vocabulary_size=10)
    with pytest.raises(ValueError, match="The corpus is empty"):
        write_token_file(splits["train"].take(0), tokenizer, str(tmp_path / "empty"))
    assert not (tmp_path / "empty").exists() and [p.name for p in tmp_path.iterdir()] == [
        directory.rsplit("/", 1)[-1]
    ]  # nothing half-written is left
    with pytest.raises(ValueError, match="outside the file's"):
        TokenFile(directory).read(len(first) - 3, 5)


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda d: (d / "ids.bin").write_bytes(bytes((d / "ids.bin").stat().st_size)), "ids.bin fails its checksum"),
        (lambda d: (d / "ids.bin").write_bytes((d / "ids.bin").read_bytes()[:-6]), "ids.bin holds"),
        (lambda d: (d / "document_starts.bin").unlink(), "cannot be read"),
        (lambda d: (d / "index.json").write_text("{"), "damaged index.json"),
        (
            lambda d: (d / "index.json").write_text(
                (d / "index.json").read_text().replace('"tokens": ', '"tokens": 9')
            ),
            "holds",
        ),  # fmt: skip
    ],
    ids=["zero-filled", "truncated", "missing", "index-not-json", "index-count"],
)
def test_a_damaged_cache_is_named_and_written_again(corpus, tmp_path, capsys, damage, reason):
    splits, tokenizer = corpus
    directory = tmp_path / fingerprint("text-sha", "tokenizer-sha", "train")
    first = write_token_file(splits["train"], tokenizer, str(directory))
    want = first.read(0, len(first))
    damage(directory)
    with pytest.raises(ValueError, match=f"The token cache {directory}.*{reason}"):
        TokenFile(str(directory))
    capsys.readouterr()
    again = write_token_file(splits["train"], tokenizer, str(directory))
    assert f"The token cache {directory}" in capsys.readouterr().err
    for got, expected in zip(again.read(0, len(again)), want):
        np.testing.assert_array_equal(got, expected)


def test_files_stay_readable_when_the_cache_is_removed_during_a_run(corpus, tmp_path):
    splits, tokenizer = corpus
    directory = tmp_path / "train"
    tokens = write_token_file(splits["train"], tokenizer, str(directory))  # a run opens its splits first
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
    ids, starts = _reference_stream(splits["train"], tokenizer)
    got_ids, got_starts = tokens.read(5, 9)  # the files were opened, and checked, before
    np.testing.assert_array_equal(got_ids, ids[5:14])
    np.testing.assert_array_equal(got_starts, starts[5:14])
