"""A user's own text: plain-text files and JSON Lines, read as documents, checked, held out and fingerprinted.

This module needs no TensorFlow, so the command lines check a corpus before anything else starts.

    --data "books/*.txt"                  every file one document (`document_separator="file"`)
    --data "notes/*.txt" --document-separator blank-line
                                          documents separated by blank lines
    --data corpus.jsonl --text-field body one document a line, its text in field "body"

A file is JSON Lines when its name ends `.jsonl` or `.ndjson` (in any case), plain text otherwise.
A document is a list of non-empty, stripped lines; each line becomes one row of the
language-modelling stream (and ends with the end-of-sentence id, as WikiText's lines do).
Documents go to a split by the rank of a seeded hash of their position (`holdout_codes`), so the
split of a document depends only on `(seed, index, count, holdout_fraction)`, never on the memory
at hand.
"""

import glob
import hashlib
import json
import os
import re

DOCUMENT_SEPARATORS = ("file", "blank-line")
SPLITS = ("train", "validation", "test")
JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")
# How documents are held out (`holdout_codes`); recorded with a corpus's settings, so a run split
# another way is never resumed onto this split.
HOLDOUT_METHOD = "splitmix64-rank"
# Where every source ends a line: text files (`read_lines`), JSON Lines records (`split_lines`) and
# TFDS texts (`corpus._lines_of`, in the graph). Only these: Python's `str.splitlines` would also end
# one at a form feed, NEL (U+0085), U+2028 and others, which stay inside a line.
LINE_END = r"\r\n|\r|\n"
_LINE_END_STR = re.compile(LINE_END)
_LINE_END_BYTES = re.compile(LINE_END.encode())
# What a line is stripped of at both ends: the characters `str.strip()` strips (`str.isspace()`),
# spelled out for the graph, where `tf.strings.strip` would strip ASCII whitespace only.
SPACES = "\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
SPACES += "\u2028\u2029\u202f\u205f\u3000"
# The JSON type of each Python type `json.loads` gives.
_JSON_TYPES = {bool: "boolean", int: "number", float: "number", type(None): "null", list: "array", dict: "object"}


def _raw_lines(f, block_size=1 << 20):
    """The lines of a binary file, without their ends (`LINE_END`)."""
    rest = b""
    for block in iter(lambda: f.read(block_size), b""):
        data = rest + block
        # The last line may go on in the next block, and a last \r may be the first half of \r\n.
        held = b"\r" if data.endswith(b"\r") else b""
        lines = _LINE_END_BYTES.split(data[: len(data) - len(held)])
        rest = lines.pop() + held
        yield from lines
    if rest:
        yield from _LINE_END_BYTES.split(rest.removesuffix(b"\r"))


def split_lines(text):
    """The non-empty stripped lines of a text: `LINE_END` ends a line, `str.strip` strips it (of `SPACES`)."""
    return [line.strip() for line in _LINE_END_STR.split(text) if line and not line.isspace()]


def read_lines(path):
    r"""The stripped non-empty lines of a UTF-8 file, as `(line_number, text)`; a byte-order mark is not text.

    `\r\n`, `\r` and `\n` each end a line (`LINE_END`), and nothing else does.

    Raises:
        ValueError: naming the file, the line and the byte, when a line is not UTF-8 or holds a NUL
            byte (UTF-16 or binary data), when the file starts with a UTF-16 byte-order mark, or when
            it cannot be read.
    """
    try:
        f = open(path, "rb")
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror}).") from None
    with f:
        for number, raw in enumerate(_raw_lines(f), start=1):
            if number == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise ValueError(
                    f"{path}: UTF-16 text (it starts with a UTF-16 byte-order mark). elita-tf reads UTF-8 text; "
                    "convert the file to UTF-8."
                )
            if 0 in raw:  # a NUL byte; `0 in` is a memchr, several times faster than `b"\x00" in`
                raise ValueError(
                    f"{path}, line {number}: a NUL byte (at byte {raw.index(0)} of the line): the file looks like "
                    "UTF-16 or binary, not text. elita-tf reads UTF-8 text; convert the file to UTF-8."
                )
            try:
                # "utf-8-sig" drops a byte-order mark at the start of the first line.
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8").strip()
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}, line {number}: not UTF-8 text ({error.reason} at byte {error.start} of the line: "
                    f"{raw[max(0, error.start - 10) : error.start + 10]!r}). elita-tf reads UTF-8 text; "
                    "convert or remove that line."
                ) from None
            if text:
                yield number, text


def is_json_lines(path):
    """Whether a file (or a pattern) is JSON Lines: its name ends `.jsonl` or `.ndjson`, in any case."""
    return path.lower().endswith(JSON_LINES_SUFFIXES)


def data_kind(data):
    """What `--data` names: `"wikitext"`, `"tfds"` (`tfds:NAME[/CONFIG]`), `"jsonl"` or `"text"` (a glob).

    A WikiText config name (`wikitext-2-v1`, ...) is WikiText; a name ending `.jsonl` or `.ndjson`
    (in any case) is JSON Lines; anything else is a glob of files, each read as JSON Lines or plain
    text by its own suffix (`is_json_lines`).
    """
    from elita_tf.data.sources import CONFIG_NAMES

    if data in CONFIG_NAMES:
        return "wikitext"
    if data.startswith("tfds:"):
        return "tfds"
    return "jsonl" if is_json_lines(data) else "text"


def expand(pattern):
    """The files a pattern names, sorted: a file of that name is itself, anything else a glob.

    A name such as `notes[1].txt` names that file, even though `[1]` would match `notes1.txt` as a glob.

    Raises:
        ValueError: when nothing matches, naming the pattern.
    """
    path = os.path.expanduser(pattern)
    if os.path.isfile(path):
        return [path]
    paths = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
    if not paths:
        raise ValueError(f"--data {pattern!r} names no file: give a file, or a glob such as 'texts/*.txt'.")
    return paths


def documents_of(paths, document_separator="file", text_field="text"):
    """Every document of the files, in order: a list of lines each.

    Each file is JSON Lines or plain text by its suffix (`is_json_lines`).

    Args:
        paths: list of file paths.
        document_separator: for plain text, `"file"` (a file is a document) or `"blank-line"`
            (blank lines separate documents). Defaults to `"file"`.
        text_field: for JSON Lines, the field holding each record's text. Defaults to `"text"`.

    Yields:
        list of `str`, the document's non-empty stripped lines.

    Raises:
        ValueError: naming the file (and line) of an unreadable or empty file, a line that is not
            UTF-8 text, a JSON line that does not parse, or a record without a string text field.
    """
    for path in paths:
        empty = True
        if is_json_lines(path):
            for number, line in read_lines(path):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}, line {number}: not JSON ({error.msg}).") from None
                if not isinstance(record, dict) or text_field not in record:
                    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                    raise ValueError(
                        f"{path}, line {number}: no text field {text_field!r} (the record has {keys}). "
                        "Name the field with --text-field."
                    )
                if not isinstance(record[text_field], str):
                    kind = _JSON_TYPES.get(type(record[text_field]), type(record[text_field]).__name__)
                    article = "an" if kind[0] in "aeiou" else "a"
                    raise ValueError(
                        f"{path}, line {number}: the field {text_field!r} holds {article} {kind}, not a string. "
                        "Name the field of the text with --text-field."
                    )
                lines = split_lines(record[text_field])
                if lines:
                    empty = False
                    yield lines
        else:
            document, previous = [], 0
            for number, text in read_lines(path):
                if document_separator == "blank-line" and document and number > previous + 1:
                    yield document
                    document = []
                document.append(text)
                previous = number
                empty = False
            if document:
                yield document
        if empty:
            raise ValueError(f"{path}: the file holds no text.")


def hash_file(digest, f):
    """Feeds the open binary file `f` into `digest` (a `hashlib` hash) a MiB at a time."""
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)


def _splitmix64(x):
    """SplitMix64's finalizer on a uint64 array: a bijection, the same on every numpy and platform."""
    import numpy as np

    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def holdout_codes(count, seed, holdout_fraction, provided=()):
    """The split of each of `count` documents: 0 train, 1 validation, 2 test (`SPLITS` order).

    Each document's position is hashed with the seed (SplitMix64); the `k` smallest hashes go to
    test and the next `k` to validation, with `k = floor(holdout_fraction * count + 0.5)`, at least
    one when `count >= 3` and `holdout_fraction > 0`, and never so many that train is left empty.
    The counts are exact whatever the seed, and a document's split depends only on
    `(seed, index, count, holdout_fraction)`. A split `provided` otherwise takes nothing: its
    documents train.

    Args:
        count: int. The number of documents.
        seed: int. Which documents are held out.
        holdout_fraction: float in `[0, 0.5)`. The share of documents for each of test and validation.
        provided: the splits (`"validation"`, `"test"`) given as data of their own.

    Returns:
        `np.ndarray` of `int8`, shape `[count]`.

    Example:
    >>> holdout_codes(40, 0, 0.05).tolist().count(1)
    2
    """
    import numpy as np  # here: the command lines import this module to check flags, and answer without it

    codes = np.zeros(count, np.int8)
    k = int(np.floor(holdout_fraction * count + 0.5))
    if count >= 3 and holdout_fraction > 0:
        k = max(k, 1)
    k = min(k, (count - 1) // 2)
    if k <= 0:
        return codes
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as the hash means it to
        key = _splitmix64(np.array([seed % 2**64], np.uint64))
        hashes = _splitmix64(np.arange(count, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + key)
    # Distinct positions have distinct hashes (a bijection), so the 2k smallest are one set.
    smallest = np.argpartition(hashes, 2 * k - 1)[: 2 * k]
    ranked = smallest[np.argsort(hashes[smallest])]
    if "test" not in provided:
        codes[ranked[:k]] = SPLITS.index("test")
    if "validation" not in provided:
        codes[ranked[k : 2 * k]] = SPLITS.index("validation")
    return codes


def split_settings(corpus, seed, **fields):
    """What, besides the data's content, decides a corpus' splits (`CorpusSettings.record`, the seed, the
    holdout method, `fields`): recorded with a run, read again by `corpus_of_record`."""
    return {**corpus.record(), **fields, "seed": seed, "holdout_method": HOLDOUT_METHOD}


class TextCorpus:
    """A corpus of text files or JSON Lines, cut into three splits of documents.

    Args:
        corpus: the `CorpusSettings` of the text (`data`, `validation_data`, `test_data`: files or
            globs; `document_separator`, `text_field`: how documents are read, `documents_of`;
            `holdout_fraction`: the share held out for each split not given, `holdout_codes`).
        seed: int. Which documents are held out. Defaults to `0`.

    Example:
    >>> corpus = TextCorpus(CorpusSettings("books/*.txt", holdout_fraction=0.1))  # doctest: +SKIP
    >>> info = corpus.check()                                                      # doctest: +SKIP
    >>> first_line = next(corpus.lines("train"))                                   # doctest: +SKIP
    """

    def __init__(self, corpus, seed=0):
        self.sources = {"train": corpus.data, "validation": corpus.validation_data, "test": corpus.test_data}
        for split, source in self.sources.items():
            if source is not None and data_kind(source) not in ("text", "jsonl"):
                raise ValueError(
                    f"The {split} text must be a glob of text files or a .jsonl file. Received: {source!r}"
                )
        self.paths = {split: expand(source) for split, source in self.sources.items() if source is not None}
        if corpus.text_field != "text" and not any(is_json_lines(p) for paths in self.paths.values() for p in paths):
            raise ValueError(
                f"--text-field applies to JSON Lines and TFDS only, and {corpus.data!r} holds no JSON Lines file "
                f"({', '.join(JSON_LINES_SUFFIXES)}). Received: text_field={corpus.text_field!r}"
            )
        self.corpus, self.seed = corpus, seed
        self._codes = None  # the split of each of `data`'s documents, once they are counted

    def settings(self):
        """What, besides the files' content, decides the splits: recorded with a run to read it again."""
        return split_settings(self.corpus, self.seed)

    def _documents(self, source):
        return documents_of(self.paths[source], self.corpus.document_separator, self.corpus.text_field)

    def _split_codes(self, count=None):
        """`holdout_codes` of `data`'s documents, with a split given as files taking nothing (its ranks train)."""
        if self._codes is None or (count is not None and count != len(self._codes)):
            if count is None:
                count = sum(1 for _ in self._documents("train"))
            self._codes = holdout_codes(count, self.seed, self.corpus.holdout_fraction, provided=self.paths)
        return self._codes

    def split_documents(self, split):
        """The documents of `split`, in order: given files, or those `data` holds out for it."""
        if split != "train" and split in self.paths:
            yield from self._documents(split)
            return
        code = SPLITS.index(split)
        codes = self._split_codes()
        for index, document in enumerate(self._documents("train")):
            if codes[index] == code:
                yield document

    def lines(self, split):
        """Every line of `split`, document after document."""
        for document in self.split_documents(split):
            yield from document

    def lines_with_starts(self, split):
        """`(line, starts_document)` for every line of `split`: True on each document's first line."""
        for document in self.split_documents(split):
            for number, line in enumerate(document):
                yield line, number == 0

    def check(self, required=SPLITS):
        """Reads every file once; returns `{"sha256", "documents": {split: count}}`.

        Raises:
            ValueError: naming the file and line of the first bad input (`documents_of`), or a split
                of `required` left without a document.
        """
        codes = self._split_codes(sum(1 for _ in self._documents("train"))).tolist()
        counts = {split: codes.count(code) for code, split in enumerate(SPLITS)}
        for split in self.paths.keys() - {"train"}:
            counts[split] = sum(1 for _ in self._documents(split))
        for split in required:
            if counts[split] == 0:
                raise ValueError(
                    f"The {split} split holds no document: {self.sources['train']!r} has "
                    f"{sum(counts.values())} in all. Give --{split}-data, or raise --holdout-fraction "
                    f"(now {self.corpus.holdout_fraction})."
                )
        return {"sha256": self.sha256(), "documents": counts}

    def sha256(self, settings=None):
        """The SHA-256 of the split settings and of every file's name and bytes.

        Args:
            settings: the settings as a run recorded them (an older elita-tf's names: its hash covers
                those); None: `settings()`.
        """
        settings = self.settings() if settings is None else settings
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
        for source, paths in self.paths.items():
            for path in paths:
                digest.update(f"{source}:{os.path.basename(path)}".encode())
                with open(path, "rb") as f:
                    hash_file(digest, f)
        return digest.hexdigest()
