"""`CorpusSettings`: which text a run reads and how it is cut into splits, checked when made.

One dataclass for `elita-train`, `elita-evaluate` and `load_corpus`; the command lines make their
flags from its fields. It needs no TensorFlow, so a command checks its flags before anything else.
"""

import dataclasses

from elita_tf.checks import fail
from elita_tf.data.sources import CONFIG_NAMES, DATA_DIR_ENV
from elita_tf.data.text_files import DOCUMENT_SEPARATORS, data_kind
from elita_tf.settings_fields import check_fields, setting, with_attributes

_SPLIT_HELP = "Text files or JSON Lines for the {} split (a glob: quote it)."
_HELD_OUT = "a share of `data`'s documents (`holdout_fraction`)"


@with_attributes
@dataclasses.dataclass(frozen=True)
class CorpusSettings:
    """The text of a run: WikiText, a TFDS dataset, or your own files, and its three splits.

    Each field's help is in its metadata (`elita_tf.settings_fields.setting`): the flags' `--help`
    and this docstring's `Attributes:` are written from it (`with_attributes`).

    Example:
    >>> CorpusSettings("notes.jsonl", text_field="body").text_field
    'body'
    """

    data: str = setting(
        "wikitext-2-v1",
        f"The text: a WikiText config {CONFIG_NAMES}, \"tfds:NAME[/CONFIG]\", a JSON Lines file (.jsonl, "
        ".ndjson), or a glob of plain-text files (quote it).",
    )
    data_dir: str = setting(
        None,
        "WikiText only: a local directory of its files (wiki.*.tokens or .raw).",
        default_help=f"${DATA_DIR_ENV}, else a download",
        local=True,
    )
    tfds_dir: str = setting(None, "Where tensorflow-datasets keeps prepared data.", local=True)
    validation_data: str = setting(None, _SPLIT_HELP.format("validation"), default_help=_HELD_OUT)
    test_data: str = setting(None, _SPLIT_HELP.format("test"), default_help=_HELD_OUT)
    document_separator: str = setting(
        "file",
        "Plain-text files: \"file\" (a file is a document) or \"blank-line\" (blank lines separate documents).",
        choices=DOCUMENT_SEPARATORS,
    )
    text_field: str = setting("text", "JSON Lines and TFDS: the field holding the text.")
    holdout_fraction: float = setting(
        0.05, "The share of `data`'s documents held out for each split it does not provide, in [0, 0.5)."
    )

    def __post_init__(self):
        check_fields(self)
        if not isinstance(self.data, str) or not self.data:
            fail("data", self.data, "a WikiText config, tfds:NAME, a .jsonl file or a glob of text files")
        kind = data_kind(self.data)
        for name in ("validation_data", "test_data"):
            if getattr(self, name) is not None and kind not in ("text", "jsonl"):
                fail(name, getattr(self, name), f"None: {self.data!r} has its own splits")
        if self.data_dir is not None and kind != "wikitext":
            fail("data_dir", self.data_dir, f"None: it names WikiText's files, and data={self.data!r}")
        if self.text_field != "text" and kind == "wikitext":
            expected = f"'text': --text-field applies to JSON Lines and TFDS, and {self.data!r} is WikiText"
            fail("text_field", self.text_field, expected)
        if not isinstance(self.holdout_fraction, (int, float)) or not 0.0 <= self.holdout_fraction < 0.5:
            fail("holdout_fraction", self.holdout_fraction, "in [0, 0.5)")

    def record(self):
        """What, besides the files' content, decides the splits: every field but the local paths."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if not field.metadata.get("local")
        }
