"""`CorpusSettings`: which text a run reads and how it is cut into splits, checked when made.

One dataclass for `elita-train`, `elita-evaluate` and `load_corpus`; the command lines make their
flags from its fields. It needs no TensorFlow, so a command checks its flags before anything else.
"""

import dataclasses

from elita_tf.data.text_files import DOCUMENT_SEPARATORS, data_kind


@dataclasses.dataclass(frozen=True)
class CorpusSettings:
    """The text of a run: WikiText, a TFDS dataset, or your own files, and its three splits.

    Attributes:
        data: str. A WikiText config (`"wikitext-2-v1"`, ...), `"tfds:NAME[/CONFIG]"`, a JSON
            Lines file (`.jsonl`, `.ndjson`), or a glob of plain-text files. Defaults to
            `"wikitext-2-v1"`.
        data_dir: str or None. WikiText only: a local directory of its files; None reads
            `ELITA_WIKITEXT_DIR`, else downloads.
        tfds_dir: str or None. Where tensorflow-datasets keeps prepared data.
        validation_data, test_data: str or None. Text files or JSON Lines for that split; a split
            not given is held out of `data`.
        document_separator: str. Plain-text files: `"file"` (a file is a document) or
            `"blank-line"` (blank lines separate documents). Defaults to `"file"`.
        text_field: str. JSON Lines and TFDS: the field holding the text. Defaults to `"text"`.
        holdout_fraction: float. The share of `data`'s documents held out for each split it does
            not provide. Defaults to `0.05`.

    Example:
    >>> CorpusSettings("notes.jsonl", text_field="body").text_field
    'body'
    """

    data: str = "wikitext-2-v1"
    data_dir: str = dataclasses.field(default=None, metadata={"local": True})
    tfds_dir: str = dataclasses.field(default=None, metadata={"local": True})
    validation_data: str = None
    test_data: str = None
    document_separator: str = "file"
    text_field: str = "text"
    holdout_fraction: float = 0.05

    def __post_init__(self):
        def fail(name, expected):
            value = getattr(self, name)
            raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")

        if not isinstance(self.data, str) or not self.data:
            fail("data", "a WikiText config, tfds:NAME, a .jsonl file or a glob of text files")
        kind = data_kind(self.data)
        for name in ("validation_data", "test_data"):
            if getattr(self, name) is not None and kind not in ("text", "jsonl"):
                fail(name, f"None: {self.data!r} has its own splits")
        if self.data_dir is not None and kind != "wikitext":
            fail("data_dir", f"None: it names WikiText's files, and data={self.data!r}")
        if self.document_separator not in DOCUMENT_SEPARATORS:
            fail("document_separator", f"one of {list(DOCUMENT_SEPARATORS)}")
        if self.text_field != "text" and kind == "wikitext":
            fail("text_field", f"'text': --text-field applies to JSON Lines and TFDS, and {self.data!r} is WikiText")
        if not isinstance(self.holdout_fraction, (int, float)) or not 0.0 <= self.holdout_fraction < 0.5:
            fail("holdout_fraction", "in [0, 0.5)")

    def record(self):
        """What, besides the files' content, decides the splits: every field but the local paths."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if not field.metadata.get("local")
        }
