"""A user's own text: plain-text files and JSON Lines, read as documents, checked, held out and fingerprinted.

This module needs no TensorFlow, so the command lines check a corpus before anything else starts.

    --data "books/*.txt"                  every file one document (`documents="file"`)
    --data "notes/*.txt" --documents blank-line
                                          documents separated by blank lines
    --data corpus.jsonl --text-field body one document a line, its text in field "body"

A document is a list of non-empty, stripped lines; each line becomes one row of the
language-modelling stream (and ends with the end-of-sentence id, as WikiText's lines do).
Documents go to a split by a seeded hash of their position, so the split of a document
depends only on `(seed, index, holdout_fraction)`, never on the memory at hand.
"""

import glob
import hashlib
import json
import os

DOCUMENTS = ("file", "blank-line")
SPLITS = ("train", "validation", "test")


def read_lines(path):
    """The stripped non-empty lines of a UTF-8 file, as `(line_number, text)`; a byte-order mark is not text.

    Raises:
        ValueError: naming the file, the line and the byte, when a line is not UTF-8, or the file
            cannot be read.
    """
    try:
        f = open(path, "rb")
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror}).") from None
    with f:
        for number, raw in enumerate(f, start=1):
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


def data_kind(data):
    """What `--data` names: `"wikitext"`, `"tfds"` (`tfds:NAME[/CONFIG]`), `"jsonl"` or `"text"` (a glob).

    A WikiText config name (`wikitext-2-v1`, ...) is WikiText; a name ending `.jsonl` is JSON Lines;
    anything else is a glob of plain-text files.
    """
    from elita_tf.data.sources import CONFIG_NAMES

    if data in CONFIG_NAMES:
        return "wikitext"
    if data.startswith("tfds:"):
        return "tfds"
    return "jsonl" if data.endswith(".jsonl") else "text"


def expand(pattern):
    """The files a glob names, sorted; a name with no glob characters is the file itself.

    Raises:
        ValueError: when nothing matches, naming the pattern.
    """
    paths = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
    if not paths:
        raise ValueError(f"--data {pattern!r} names no file: give a file, or a glob such as 'texts/*.txt'.")
    return paths


def documents_of(paths, kind, documents="file", text_field="text"):
    """Every document of the files, in order: a list of lines each.

    Args:
        paths: list of file paths.
        kind: `"text"` or `"jsonl"`.
        documents: for plain text, `"file"` (a file is a document) or `"blank-line"`
            (blank lines separate documents). Defaults to `"file"`.
        text_field: for JSON Lines, the field holding each record's text. Defaults to `"text"`.

    Yields:
        list of `str`, the document's non-empty stripped lines.

    Raises:
        ValueError: naming the file (and line) of an unreadable or empty file, a line that is not
            UTF-8, a JSON line that does not parse, or a record without a text field.
    """
    for path in paths:
        empty = True
        if kind == "jsonl":
            for number, line in read_lines(path):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}, line {number}: not JSON ({error.msg}).") from None
                if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                    raise ValueError(
                        f"{path}, line {number}: no text field {text_field!r} (the record has {keys}). "
                        "Name the field with --text-field."
                    )
                lines = [text.strip() for text in record[text_field].splitlines() if text.strip()]
                if lines:
                    empty = False
                    yield lines
        else:
            document, previous = [], 0
            for number, text in read_lines(path):
                if documents == "blank-line" and document and number > previous + 1:
                    yield document
                    document = []
                document.append(text)
                previous = number
                empty = False
            if document:
                yield document
        if empty:
            raise ValueError(f"{path}: the file holds no text.")


def split_of(index, seed, holdout_fraction):
    """The split of document `index`: test and validation each take `holdout_fraction` of the documents."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < holdout_fraction:
        return "test"
    return "validation" if u < 2 * holdout_fraction else "train"


class TextCorpus:
    """A corpus of text files or JSON Lines, cut into three splits of documents.

    Args:
        data: str. A glob of plain-text files or a `.jsonl` file (`data_kind`).
        validation_data, test_data: str or None. The same, for a given split; a split not given is
            held out of `data`.
        documents, text_field: how documents are read (`documents_of`).
        holdout_fraction: float in `[0, 0.5)`. The share of `data`'s documents held out for each
            split not given. Defaults to `0.05`.
        seed: int. Which documents are held out. Defaults to `0`.

    Example:
    >>> corpus = TextCorpus("books/*.txt", holdout_fraction=0.1)  # doctest: +SKIP
    >>> info = corpus.check()                                      # doctest: +SKIP
    >>> first_line = next(corpus.lines("train"))                   # doctest: +SKIP
    """

    def __init__(
        self,
        data,
        validation_data=None,
        test_data=None,
        documents="file",
        text_field="text",
        holdout_fraction=0.05,
        seed=0,
    ):
        if documents not in DOCUMENTS:
            raise ValueError(f"`documents` must be one of {list(DOCUMENTS)}. Received: documents={documents!r}")
        if not 0.0 <= holdout_fraction < 0.5:
            raise ValueError(f"`holdout_fraction` must be in [0, 0.5). Received: holdout_fraction={holdout_fraction}")
        self.sources = {"train": data, "validation": validation_data, "test": test_data}
        for split, source in self.sources.items():
            if source is not None and data_kind(source) not in ("text", "jsonl"):
                raise ValueError(
                    f"The {split} text must be a glob of text files or a .jsonl file. Received: {source!r}"
                )
        self.paths = {split: expand(source) for split, source in self.sources.items() if source is not None}
        self.documents, self.text_field = documents, text_field
        self.holdout_fraction, self.seed = holdout_fraction, seed

    def settings(self):
        """What, besides the files' content, decides the splits: recorded with a run to read it again."""
        return {
            "validation_data": self.sources["validation"],
            "test_data": self.sources["test"],
            "documents": self.documents,
            "text_field": self.text_field,
            "holdout_fraction": self.holdout_fraction,
            "seed": self.seed,
        }

    def _documents(self, source):
        return documents_of(self.paths[source], data_kind(self.sources[source]), self.documents, self.text_field)

    def _split_of(self, index):
        held = split_of(index, self.seed, self.holdout_fraction)
        return "train" if held in self.paths else held  # a split given as files takes nothing from `data`

    def split_documents(self, split):
        """The documents of `split`, in order: given files, or those `data` holds out for it."""
        if split != "train" and split in self.paths:
            yield from self._documents(split)
            return
        for index, document in enumerate(self._documents("train")):
            if self._split_of(index) == split:
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
        digest = hashlib.sha256(json.dumps(self.settings(), sort_keys=True).encode())
        for source, paths in self.paths.items():
            for path in paths:
                digest.update(f"{source}:{os.path.basename(path)}".encode())
                with open(path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
        counts = dict.fromkeys(SPLITS, 0)
        for index, _ in enumerate(self._documents("train")):
            counts[self._split_of(index)] += 1
        for split in self.paths.keys() - {"train"}:
            counts[split] = sum(1 for _ in self._documents(split))
        for split in required:
            if counts[split] == 0:
                raise ValueError(
                    f"The {split} split holds no document: {self.sources['train']!r} has "
                    f"{sum(counts.values())} in all. Give --{split}-data, or raise --holdout-fraction "
                    f"(now {self.holdout_fraction})."
                )
        return {"sha256": digest.hexdigest(), "documents": counts}
