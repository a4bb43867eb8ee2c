import json

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from elita_tf.data import TextCorpus, load_corpus, sample_text
from elita_tf.data.text_files import data_kind, split_of
from tests.conftest import WORDS


def _document(seed, lines=3):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, 8)) + " ." for _ in range(lines)]


def _lines(dataset):
    return [line.decode() for line in dataset.as_numpy_iterator()]


def test_data_kind_tells_every_form_apart():
    assert data_kind("wikitext-2-v1") == "wikitext" and data_kind("tfds:lm1b/subwords8k") == "tfds"
    assert data_kind("dir/corpus.jsonl") == "jsonl" and data_kind("dir/*.txt") == "text"


def test_text_files_are_documents_held_out_by_a_seeded_hash(tmp_path):
    docs = [_document(i) for i in range(40)]
    for i, doc in enumerate(docs):
        (tmp_path / f"{i:02d}.txt").write_text("\n".join(doc) + "\n\n")
    corpus = TextCorpus(str(tmp_path / "*.txt"), holdout_fraction=0.2, seed=3)
    checked = corpus.check()
    want = {split: [docs[i] for i in range(40) if split_of(i, 3, 0.2) == split] for split in checked["documents"]}
    assert {split: len(d) for split, d in want.items()} == checked["documents"]
    assert all(checked["documents"].values()) and sum(checked["documents"].values()) == 40
    for split, documents in want.items():
        assert list(corpus.split_documents(split)) == documents
    # The held-out documents follow the seed; the hash names the text and the split.
    other = TextCorpus(str(tmp_path / "*.txt"), holdout_fraction=0.2, seed=4)
    assert list(other.split_documents("test")) != want["test"]
    assert other.check()["sha256"] != checked["sha256"]
    # Through tf.data, the same lines in the same order.
    splits, info = load_corpus(str(tmp_path / "*.txt"), holdout_fraction=0.2, seed=3)
    assert _lines(splits["validation"]) == [line for doc in want["validation"] for line in doc]
    assert info["sha256"] == checked["sha256"] and info["corpus"]["holdout_fraction"] == 0.2


def test_blank_lines_separate_documents_and_given_splits_take_nothing_from_train(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n\n\nthree\n\nfour\n")
    (tmp_path / "valid.txt").write_text("v1\nv2\n")
    (tmp_path / "test.txt").write_text("t1\n")
    by_file = TextCorpus(str(tmp_path / "a.txt"), str(tmp_path / "valid.txt"), str(tmp_path / "test.txt"))
    assert list(by_file.split_documents("train")) == [["one", "two", "three", "four"]]
    blank = TextCorpus(
        str(tmp_path / "a.txt"), str(tmp_path / "valid.txt"), str(tmp_path / "test.txt"), documents="blank-line"
    )
    assert list(blank.split_documents("train")) == [["one", "two"], ["three"], ["four"]]
    assert list(blank.split_documents("validation")) == [["v1", "v2"]] and list(blank.lines("test")) == ["t1"]
    # With document starts: True on each document's first line, through tf.data.
    splits, _ = load_corpus(
        str(tmp_path / "a.txt"),
        validation_data=str(tmp_path / "valid.txt"),
        test_data=str(tmp_path / "test.txt"),
        documents="blank-line",
        document_starts=True,
    )
    pairs = [(line.decode(), bool(start)) for line, start in splits["train"].as_numpy_iterator()]
    assert pairs == [("one", True), ("two", False), ("three", True), ("four", True)]


def test_json_lines_read_the_text_field(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps({"id": i, "body": f"line {i}\nmore {i}"}) for i in range(6)) + "\n")
    corpus = TextCorpus(str(path), text_field="body", holdout_fraction=0.0)
    assert list(corpus.split_documents("train"))[2] == ["line 2", "more 2"]
    with pytest.raises(ValueError, match=r"c.jsonl, line 1: no text field 'text' \(the record has \['body', 'id'\]\)"):
        TextCorpus(str(path)).check()


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("empty.txt", b"\n  \n", r"empty.txt: the file holds no text"),
        ("latin.txt", b"fine\ncaf\xe9\n", r"latin.txt, line 2: not UTF-8 text"),
        ("bad.jsonl", b'{"text": "a"}\n{"text": \n', r"bad.jsonl, line 2: not JSON"),
        ("list.jsonl", b'["a"]\n', r"list.jsonl, line 1: no text field 'text' \(the record has list\)"),
    ],
)
def test_bad_text_is_named_by_file_and_line(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=message):
        TextCorpus(str(tmp_path / name), holdout_fraction=0.0).check(required=("train",))


def test_a_glob_matching_nothing_and_a_split_without_documents_are_errors(tmp_path):
    with pytest.raises(ValueError, match=r"--data '.*nothing-\*.txt' names no file"):
        TextCorpus(str(tmp_path / "nothing-*.txt"))
    (tmp_path / "one.txt").write_text("a single document\n")
    with pytest.raises(ValueError, match=r"The (validation|test) split holds no document: .* has 1 in all"):
        TextCorpus(str(tmp_path / "one.txt")).check()
    with pytest.raises(ValueError, match=r"`holdout_fraction` must be in \[0, 0.5\). Received: holdout_fraction=0.5"):
        TextCorpus(str(tmp_path / "one.txt"), holdout_fraction=0.5)


def test_the_tokenizer_sample_is_bounded_seeded_and_whole_when_it_fits():
    lines = tf.data.Dataset.from_tensor_slices([f"line number {i:04d}" for i in range(2000)])  # 16 bytes each
    assert sample_text(lines, 10**6) == [f"line number {i:04d}" for i in range(2000)]
    sample = sample_text(lines, 3200, seed=1)
    assert 0 < sum(map(len, sample)) <= 3200 and len(sample) > 100
    assert sample == sample_text(lines, 3200, seed=1) != sample_text(lines, 3200, seed=2)
    assert sample != [f"line number {i:04d}" for i in range(len(sample))]  # spread over the corpus, not its head


class TinyText(tfds.core.GeneratorBasedBuilder):
    """A TFDS text dataset made by the test: a train and a test split, no validation split."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        features = tfds.features.FeaturesDict({"story": tfds.features.Text(), "label": tf.int64})
        return tfds.core.DatasetInfo(builder=self, features=features)

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(0, 60), "test": self._generate_examples(60, 70)}

    def _generate_examples(self, start, end):
        for i in range(start, end):
            yield i, {"story": "\n".join(_document(i, 2)), "label": i}


def test_a_tfds_dataset_gives_its_splits_and_holds_out_the_missing_one(tmp_path):
    TinyText(data_dir=str(tmp_path)).download_and_prepare()
    splits, info = load_corpus("tfds:tiny_text", tfds_dir=str(tmp_path), holdout_fraction=0.2, seed=0)
    # The single text feature is found whatever its name; the test split is TFDS', validation is held out.
    assert info["corpus"]["text_field"] == "story" and info["source"] == "tfds:tiny_text/1.0.0"
    validation = _lines(splits["validation"])
    assert 0 < len(validation) < 60 and len(validation) % 2 == 0  # whole examples, about a fifth
    # TFDS keeps examples in its own (shuffled) order: the same lines, each example's two together.
    test = _lines(splits["test"])
    assert sorted(zip(test[::2], test[1::2])) == sorted(tuple(_document(i, 2)) for i in range(60, 70))
    train = _lines(splits["train"])
    assert len(train) + len(validation) == 120 and not set(train) & set(validation)
    # With document starts, each example's first line starts a document.
    splits, _ = load_corpus("tfds:tiny_text", tfds_dir=str(tmp_path), document_starts=True)
    starts = [bool(start) for _, start in splits["test"].as_numpy_iterator()]
    assert starts == [True, False] * 10
    with pytest.raises(ValueError, match=r"--validation-data and --test-data go with text files"):
        load_corpus("tfds:tiny_text", tfds_dir=str(tmp_path), validation_data="x.txt")
    with pytest.raises(ValueError, match=r"tfds:no_such_dataset_here"):
        load_corpus("tfds:no_such_dataset_here", tfds_dir=str(tmp_path))
