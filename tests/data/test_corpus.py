import io
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from elita_tf.data import TextCorpus, load_corpus, sample_text, text_files
from elita_tf.data.corpus import corpus_of_record
from elita_tf.data.corpus_settings import CorpusSettings
from elita_tf.data.text_files import HOLDOUT_METHOD, SPLITS, _splitmix64, data_kind, expand, holdout_codes, read_lines
from tests.conftest import WORDS, write_documents


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
    corpus = TextCorpus(CorpusSettings(str(tmp_path / "*.txt"), holdout_fraction=0.2), seed=3)
    checked = corpus.check()
    codes = holdout_codes(40, 3, 0.2)
    want = {split: [docs[i] for i in range(40) if SPLITS[codes[i]] == split] for split in checked["documents"]}
    assert {split: len(d) for split, d in want.items()} == checked["documents"]
    assert checked["documents"] == {"train": 24, "validation": 8, "test": 8}
    for split, documents in want.items():
        assert list(corpus.split_documents(split)) == documents
    # The held-out documents follow the seed; the hash names the text and the split.
    other = TextCorpus(CorpusSettings(str(tmp_path / "*.txt"), holdout_fraction=0.2), seed=4)
    assert list(other.split_documents("test")) != want["test"]
    assert other.check()["sha256"] != checked["sha256"]
    # Through tf.data, the same lines in the same order.
    splits, info = load_corpus(CorpusSettings(str(tmp_path / "*.txt"), holdout_fraction=0.2), seed=3)
    assert _lines(splits["validation"]) == [line for doc in want["validation"] for line in doc]
    assert info["sha256"] == checked["sha256"] and info["corpus"]["holdout_fraction"] == 0.2


def test_blank_lines_separate_documents_and_given_splits_take_nothing_from_train(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n\n\nthree\n\nfour\n")
    (tmp_path / "valid.txt").write_text("v1\nv2\n")
    (tmp_path / "test.txt").write_text("t1\n")
    by_file = TextCorpus(
        CorpusSettings(
            str(tmp_path / "a.txt"), validation_data=str(tmp_path / "valid.txt"), test_data=str(tmp_path / "test.txt")
        )
    )
    assert list(by_file.split_documents("train")) == [["one", "two", "three", "four"]]
    blank = TextCorpus(
        CorpusSettings(
            str(tmp_path / "a.txt"),
            validation_data=str(tmp_path / "valid.txt"),
            test_data=str(tmp_path / "test.txt"),
            document_separator="blank-line",
        )
    )
    assert list(blank.split_documents("train")) == [["one", "two"], ["three"], ["four"]]
    assert list(blank.split_documents("validation")) == [["v1", "v2"]] and list(blank.lines("test")) == ["t1"]
    # With document starts: True on each document's first line, through tf.data.
    splits, _ = load_corpus(
        CorpusSettings(
            str(tmp_path / "a.txt"),
            validation_data=str(tmp_path / "valid.txt"),
            test_data=str(tmp_path / "test.txt"),
            document_separator="blank-line",
        ),
        document_starts=True,
    )
    pairs = [(line.decode(), bool(start)) for line, start in splits["train"].as_numpy_iterator()]
    assert pairs == [("one", True), ("two", False), ("three", True), ("four", True)]


def test_json_lines_read_the_text_field(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps({"id": i, "body": f"line {i}\nmore {i}"}) for i in range(6)) + "\n")
    corpus = TextCorpus(CorpusSettings(str(path), text_field="body", holdout_fraction=0.0))
    assert list(corpus.split_documents("train"))[2] == ["line 2", "more 2"]
    with pytest.raises(ValueError, match=r"c.jsonl, line 1: no text field 'text' \(the record has \['body', 'id'\]\)"):
        TextCorpus(CorpusSettings(str(path))).check()


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
        TextCorpus(CorpusSettings(str(tmp_path / name), holdout_fraction=0.0)).check(required=("train",))


def test_a_glob_matching_nothing_and_a_split_without_documents_are_errors(tmp_path):
    with pytest.raises(ValueError, match=r"--data '.*nothing-\*.txt' names no file"):
        TextCorpus(CorpusSettings(str(tmp_path / "nothing-*.txt")))
    (tmp_path / "one.txt").write_text("a single document\n")
    with pytest.raises(ValueError, match=r"The (validation|test) split holds no document: .* has 1 in all"):
        TextCorpus(CorpusSettings(str(tmp_path / "one.txt"))).check()
    with pytest.raises(ValueError, match=r"`holdout_fraction` must be in \[0, 0.5\). Received: holdout_fraction=0.5"):
        TextCorpus(CorpusSettings(str(tmp_path / "one.txt"), holdout_fraction=0.5))


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
    splits, info = load_corpus(CorpusSettings("tfds:tiny_text", tfds_dir=str(tmp_path), holdout_fraction=0.2), seed=0)
    # The single text feature is found whatever its name; the test split is TFDS', validation is held out.
    assert info["corpus"]["text_field"] == "story" and info["source"] == "tfds:tiny_text/1.0.0"
    validation = _lines(splits["validation"])
    # Held out by the rank of each example's hash, in TFDS' order: exactly a fifth, as for text files.
    train_split = tfds.builder("tiny_text", data_dir=str(tmp_path)).as_dataset(split="train", shuffle_files=False)
    stories = [example["story"].decode() for example in train_split.as_numpy_iterator()]
    held = np.flatnonzero(holdout_codes(60, 0, 0.2) == SPLITS.index("validation"))
    assert validation == [line for i in held for line in stories[i].split("\n")] and len(held) == 12
    assert info["corpus"]["holdout_method"] == HOLDOUT_METHOD
    # TFDS keeps examples in its own (shuffled) order: the same lines, each example's two together.
    test = _lines(splits["test"])
    assert sorted(zip(test[::2], test[1::2])) == sorted(tuple(_document(i, 2)) for i in range(60, 70))
    train = _lines(splits["train"])
    assert len(train) + len(validation) == 120 and not set(train) & set(validation)
    # With document starts, each example's first line starts a document.
    splits, _ = load_corpus(CorpusSettings("tfds:tiny_text", tfds_dir=str(tmp_path)), document_starts=True)
    starts = [bool(start) for _, start in splits["test"].as_numpy_iterator()]
    assert starts == [True, False] * 10
    with pytest.raises(ValueError, match=r"`validation_data` must be None: .tfds:tiny_text. has its own splits"):
        load_corpus(CorpusSettings("tfds:tiny_text", tfds_dir=str(tmp_path), validation_data="x.txt"))
    with pytest.raises(ValueError, match=r"tfds:no_such_dataset_here"):
        load_corpus(CorpusSettings("tfds:no_such_dataset_here", tfds_dir=str(tmp_path)))


class ShelvedText(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A TFDS text dataset of two configs that TFDS knows by its prepared files alone, as one prepared elsewhere."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="small"), tfds.core.BuilderConfig(name="large")]

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(4):
            yield i, {"text": " ".join(_document(i, 1))}


class KnownText(ShelvedText):
    """`ShelvedText` with its builder registered: TFDS knows both configs."""


class NumbersOnly(tfds.core.GeneratorBasedBuilder):
    """A TFDS dataset with no text feature."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        features = {"count": tf.int64, "label": tfds.features.ClassLabel(names=["odd", "even"])}
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(4):
            yield i, {"count": i, "label": i % 2}


@pytest.mark.parametrize(
    "name, configs",
    [("shelved_text", ["small"]), ("known_text", ["large", "small"])],
    ids=["prepared-only", "registered"],
)
def test_a_tfds_config_or_version_the_dataset_lacks_is_named_with_those_it_has(tmp_path, name, configs):
    ShelvedText(data_dir=str(tmp_path), config="small").download_and_prepare()
    if name == "shelved_text":
        assert _lines(load_corpus(CorpusSettings("tfds:shelved_text/small", tfds_dir=str(tmp_path)))[0]["train"])

    def refused(data):
        with pytest.raises(ValueError) as error:
            load_corpus(CorpusSettings(data, tfds_dir=str(tmp_path)))
        return str(error.value)

    assert refused(f"tfds:{name}/nope") == (
        f"--data tfds:{name}/nope: the dataset {name} has no config 'nope': its configs are {configs}. "
        "Received: config='nope'"
    )
    for data, dataset in [(f"tfds:{name}:9.9.9", name), (f"tfds:{name}/small:9.9.9", f"{name}/small")]:
        assert refused(data) == (
            f"--data {data}: the dataset {dataset} has no version 9.9.9: its versions are ['1.0.0']. "
            "Received: version='9.9.9'"
        )
    assert "tfds:no_such_text_here: Dataset no_such_text_here not found." in refused("tfds:no_such_text_here")


def test_a_tfds_dataset_without_text_names_the_features_it_has(tmp_path):
    NumbersOnly(data_dir=str(tmp_path)).download_and_prepare()
    with pytest.raises(ValueError) as error:
        load_corpus(CorpusSettings("tfds:numbers_only", tfds_dir=str(tmp_path)))
    assert str(error.value) == (
        "tfds:numbers_only has no text feature (tfds.features.Text) to train on: its features are "
        "count (Tensor), label (ClassLabel). Choose a dataset with one. Received: --data tfds:numbers_only"
    )


@pytest.mark.parametrize(
    "content, message",
    [
        ("the cat\nsees\n".encode("utf-16-le"), r"x.txt, line 1: .*looks like UTF-16 or binary"),
        ("the cat\nsees\n".encode("utf-16-be"), r"x.txt, line 1: .*looks like UTF-16 or binary"),
        (b"\x00" * 64, r"x.txt, line 1: .*looks like UTF-16 or binary"),
        (b"fine\nthen \x00\x01\x02\n", r"x.txt, line 2: .*looks like UTF-16 or binary"),
        ("the cat\nsees\n".encode("utf-16"), r"x.txt: .*UTF-16"),  # with its byte-order mark
    ],
    ids=["utf-16-le", "utf-16-be", "nul", "binary-line-2", "utf-16-bom"],
)
def test_utf16_and_binary_files_are_refused_naming_file_and_line(tmp_path, content, message):
    (tmp_path / "x.txt").write_bytes(content)
    with pytest.raises(ValueError, match=message) as error:
        TextCorpus(CorpusSettings(str(tmp_path / "x.txt"), holdout_fraction=0.0)).check(required=("train",))
    assert len(str(error.value).splitlines()) == 1 and "UTF-8" in str(error.value)


@pytest.mark.parametrize("end", ["\r", "\r\n", "\n"], ids=["cr", "crlf", "lf"])
def test_cr_crlf_and_lf_all_end_lines(tmp_path, end):
    (tmp_path / "a.txt").write_bytes(end.join(["one", "two", "", "", "three", "", "four", ""]).encode())
    assert list(read_lines(str(tmp_path / "a.txt"))) == [(1, "one"), (2, "two"), (5, "three"), (7, "four")]
    # A file read in blocks: a line, or a \r\n, cut by a block's end is one line all the same.
    data = (tmp_path / "a.txt").read_bytes() + b"five"
    for size in [1, 2, 3, 4]:
        assert list(text_files._raw_lines(io.BytesIO(data), block_size=size)) == data.splitlines()
    blank = TextCorpus(CorpusSettings(str(tmp_path / "a.txt"), document_separator="blank-line", holdout_fraction=0.0))
    assert list(blank.split_documents("train")) == [["one", "two"], ["three"], ["four"]]


# Documents with every line end, and characters Python's `str.splitlines` would also end a line at, and the
# lines each source must cut them into: only \r\n, \r and \n end a line; `str.strip` strips both ends.
MIXED_ENDS = ["one\rtwo\r\nthree\nfour\r", "form\ffeed, next\x85line", "a line\u2028separator\u3000"]
MIXED_ENDS += ["\u3000 x \t\r\n\r\nlast\x1c"]
MIXED_LINES = [["one", "two", "three", "four"], ["form\ffeed, next\x85line"], ["a line\u2028separator"], ["x", "last"]]


class MixedEndsText(tfds.core.GeneratorBasedBuilder):
    """`MIXED_ENDS` as a TFDS dataset, an example each."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i, text in enumerate(MIXED_ENDS):
            yield i, {"text": text}


def test_every_source_cuts_the_same_text_into_the_same_lines(tmp_path):
    (tmp_path / "txt").mkdir()
    for i, text in enumerate(MIXED_ENDS):
        (tmp_path / "txt" / f"{i}.txt").write_bytes(text.encode())
    (tmp_path / "all.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in MIXED_ENDS))
    MixedEndsText(data_dir=str(tmp_path / "tfds")).download_and_prepare()
    for data in [str(tmp_path / "txt" / "*.txt"), str(tmp_path / "all.jsonl"), "tfds:mixed_ends_text"]:
        corpus = CorpusSettings(data, holdout_fraction=0.0, tfds_dir=str(tmp_path / "tfds"))
        splits, _ = load_corpus(corpus, required_splits=("train",), document_starts=True)
        documents = []
        for line, start in splits["train"].as_numpy_iterator():
            documents += [[]] if start else []
            documents[-1].append(line.decode())
        assert sorted(documents) == sorted(MIXED_LINES), data  # TFDS keeps its own order of examples
    assert text_files.SPACES == "".join(c for c in map(chr, range(0x110000)) if c.isspace())


def test_json_lines_are_told_by_suffix_whatever_its_case(tmp_path):
    records = "".join(json.dumps({"id": i, "body": f"record {i}"}) + "\n" for i in range(3))
    for name in ("FILE.JSONL", "more.ndjson"):
        (tmp_path / name).write_text(records)
        assert data_kind(str(tmp_path / name)) == "jsonl"
        corpus = TextCorpus(CorpusSettings(str(tmp_path / name), text_field="body", holdout_fraction=0.0))
        assert list(corpus.lines("train")) == ["record 0", "record 1", "record 2"]
    # Each file of a glob by its own suffix.
    (tmp_path / "plain.txt").write_text('{"body": "not a record"}\n')
    corpus = TextCorpus(CorpusSettings(str(tmp_path / "*"), text_field="body", holdout_fraction=0.0))
    assert list(corpus.lines("train")) == ["record 0", "record 1", "record 2"] * 2 + ['{"body": "not a record"}']
    with pytest.raises(ValueError, match=r"--text-field applies to JSON Lines and TFDS only.*text_field='body'"):
        TextCorpus(CorpusSettings(str(tmp_path / "*.txt"), text_field="body"))
    with pytest.raises(ValueError, match=r"--text-field applies to JSON Lines and TFDS only"):
        load_corpus(CorpusSettings(str(tmp_path / "*.txt"), text_field="body"))


@pytest.mark.parametrize(
    "value, kind",
    [("5", "number"), ("null", "null"), ('["a"]', "array"), ('{"a": "b"}', "object"), ("true", "boolean")],
)
def test_a_text_field_that_is_not_a_string_says_what_it_holds(tmp_path, value, kind):
    (tmp_path / "x.jsonl").write_text('{"text": "fine"}\n{"text": ' + value + "}\n")
    with pytest.raises(ValueError, match=rf"x.jsonl, line 2: the field 'text' holds an? {kind}, not a string"):
        TextCorpus(CorpusSettings(str(tmp_path / "x.jsonl"), holdout_fraction=0.0)).check(required=("train",))


def test_a_file_name_with_glob_characters_is_that_file(tmp_path):
    (tmp_path / "notes[1].txt").write_text("the bracketed one\n")
    (tmp_path / "notes1.txt").write_text("the plain one\n")
    assert expand(str(tmp_path / "notes[1].txt")) == [str(tmp_path / "notes[1].txt")]
    corpus = TextCorpus(CorpusSettings(str(tmp_path / "notes[1].txt"), holdout_fraction=0.0))
    assert list(corpus.lines("train")) == ["the bracketed one"]
    assert expand(str(tmp_path / "notes[0-9].txt")) == [str(tmp_path / "notes1.txt")]  # no such file: a glob


def test_a_sample_budget_that_holds_no_line_says_so():
    lines = tf.data.Dataset.from_tensor_slices(["the first line", "a second"])
    with pytest.raises(
        ValueError, match=r"holds no line of the corpus: its first line alone has 14 bytes.*tokenizer_sample_bytes"
    ):
        sample_text(lines, 1)
    assert sample_text(lines.take(0), 1) == []  # a corpus that is truly empty: train_sentencepiece says so


@pytest.mark.parametrize(
    "count, fraction, want",
    [(40, 0.05, (36, 2, 2)), (3, 0.05, (1, 1, 1)), (100, 0.1, (80, 10, 10)), (4, 0.0, (4, 0, 0))],
)
def test_held_out_documents_are_chosen_by_rank(tmp_path, count, fraction, want):
    for i in range(count):
        (tmp_path / f"{i:03d}.txt").write_text("\n".join(_document(i)) + "\n")
    corpus = TextCorpus(CorpusSettings(str(tmp_path / "*.txt"), holdout_fraction=fraction), seed=5)
    counts = corpus.check(required=("train",))["documents"]
    assert (counts["train"], counts["validation"], counts["test"]) == want
    codes = holdout_codes(count, 5, fraction)  # what the TFDS loader looks up
    # By rank: the documents' seeded hashes in order, the k smallest test, the next k validation.
    with np.errstate(over="ignore"):
        key = _splitmix64(np.array([5], np.uint64))
        ranked = np.argsort(_splitmix64(np.arange(count, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + key))
    k = want[2]
    assert sorted(np.flatnonzero(codes == 2)) == sorted(ranked[:k])
    assert sorted(np.flatnonzero(codes == 1)) == sorted(ranked[k : 2 * k])
    for code, split in enumerate(SPLITS):
        held = np.flatnonzero(codes == code)
        assert list(corpus.split_documents(split)) == [_document(i) for i in held]
    # The k smallest hashes go to test, the next k to validation: the test documents stay when the fraction grows.
    if fraction:
        larger = holdout_codes(count, 5, fraction + 0.1)
        assert set(np.flatnonzero(codes == 2)) <= set(np.flatnonzero(larger == 2))


def test_the_holdout_method_is_part_of_the_settings_and_of_the_fingerprint(tmp_path, monkeypatch):
    glob = write_documents(tmp_path / "texts", 8)
    corpus = TextCorpus(CorpusSettings(glob, holdout_fraction=0.2), seed=3)
    assert corpus.settings()["holdout_method"] == HOLDOUT_METHOD
    fingerprint = corpus.check()["sha256"]
    with monkeypatch.context() as patch:
        patch.setattr(text_files, "HOLDOUT_METHOD", "another")
        assert TextCorpus(CorpusSettings(glob, holdout_fraction=0.2), seed=3).check()["sha256"] != fingerprint
    # A run's recorded settings read the corpus again (elita-evaluate).
    again, seed = corpus_of_record(glob, corpus.settings())
    splits, info = load_corpus(again, seed=seed)
    assert info["sha256"] == corpus.check()["sha256"] and info["corpus"] == corpus.settings()
    with pytest.raises(ValueError, match=r"Received: holdout_method='threshold'"):
        corpus_of_record(glob, {**corpus.settings(), "holdout_method": "threshold"})
    # A run recorded before the method was (elita-tf 0.1.0 at first) held documents out another way.
    older = {key: value for key, value in corpus.settings().items() if key != "holdout_method"}
    with pytest.raises(ValueError, match=r"Received: holdout_method='sha256-threshold'"):
        corpus_of_record(glob, older)


class RetoldText(tfds.core.GeneratorBasedBuilder):
    """A TFDS text dataset the test prepares twice: the same name, version and count, other text."""

    VERSION = tfds.core.Version("1.0.0")
    telling = 0

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(12):
            yield i, {"text": " ".join(_document(1000 * self.telling + i, 1))}


def test_a_regenerated_tfds_dataset_has_another_fingerprint(tmp_path, monkeypatch):
    builder = RetoldText(data_dir=str(tmp_path))
    builder.download_and_prepare()
    first, info = load_corpus(CorpusSettings("tfds:retold_text", tfds_dir=str(tmp_path), holdout_fraction=0.1))
    first = _lines(first["train"])
    assert (
        load_corpus(CorpusSettings("tfds:retold_text", tfds_dir=str(tmp_path), holdout_fraction=0.1))[1]["sha256"]
        == info["sha256"]
    )
    # Regenerated in place with other text: the same description, other prepared files.
    shutil.rmtree(builder.data_dir)
    monkeypatch.setattr(RetoldText, "telling", 1)
    RetoldText(data_dir=str(tmp_path)).download_and_prepare()
    again, regenerated = load_corpus(CorpusSettings("tfds:retold_text", tfds_dir=str(tmp_path), holdout_fraction=0.1))
    assert _lines(again["train"]) != first
    assert regenerated["sha256"] != info["sha256"]
    assert info["corpus"]["holdout_method"] == HOLDOUT_METHOD
