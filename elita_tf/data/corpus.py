"""Any training text as three `tf.data` splits of lines: WikiText, a TFDS text dataset, text files or JSON Lines.

    splits, info = load_corpus("wikitext-2-v1")                  # WikiText, as `load_wikitext`
    splits, info = load_corpus("tfds:lm1b", text_field="text")    # any TFDS dataset with a text feature
    splits, info = load_corpus("books/*.txt", holdout_fraction=0.1)
    splits, info = load_corpus("corpus.jsonl", text_field="body")

Every form gives `{"train", "validation", "test"}` datasets of `tf.string` lines, and `info`:
`{"dataset", "source", "sha256"}`, plus `"corpus"` (the settings that decide the splits) for all
but WikiText. A split the data does not provide is held out of the train split by the rank of a
seeded hash of each document's (or TFDS example's) position, the same rule for both
(`text_files.holdout_codes`).
"""

import hashlib
import json
import os

import numpy as np
import tensorflow as tf

from elita_tf.data.text_files import HOLDOUT_METHOD, SPLITS, TextCorpus, data_kind, holdout_codes
from elita_tf.data.wikitext import is_article_title, load_wikitext

# Other names TFDS datasets give their validation split.
_VALIDATION_NAMES = ("validation", "valid", "dev")


def _lines_of(texts, document_starts=False):
    """A dataset of texts as one of their non-empty stripped lines (with `document_starts`, `(line, first)` pairs)."""

    def lines(text):
        parts = tf.strings.strip(tf.strings.split(text, "\n"))
        parts = tf.boolean_mask(parts, tf.strings.length(parts) > 0)
        return (parts, tf.equal(tf.range(tf.size(parts)), 0)) if document_starts else parts

    return texts.map(lines).unbatch()


def _in_blocks(items, pairs, size=1024):
    """`items` (lines, or `(line, start)` pairs) as numpy blocks of up to `size`."""
    block = []
    for item in items:
        block.append(item)
        if len(block) == size:
            yield _block(block, pairs)
            block = []
    if block:
        yield _block(block, pairs)


def _block(block, pairs):
    if not pairs:
        return np.array(block, dtype=object)
    return np.array([line for line, _ in block], dtype=object), np.array([start for _, start in block], dtype=bool)


def prepared_sha256(directory):
    """One SHA-256 over the files of a prepared TFDS dataset (its shards, `dataset_info.json`, ...), by name (hex).

    The dataset's description alone does not tell a dataset regenerated with other text of the same
    count from the one before.
    """
    digest = hashlib.sha256()
    for name in sorted(tf.io.gfile.listdir(directory)):
        path = os.path.join(directory, name)
        if tf.io.gfile.isdir(path):
            continue
        digest.update(f"{name}\0".encode())
        with tf.io.gfile.GFile(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _load_tfds(name, tfds_dir, text_field, holdout_fraction, seed, document_starts):
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=tfds_dir)
        builder.download_and_prepare()
    except Exception as error:  # noqa: BLE001 - TFDS raises many kinds; the first line says which
        raise ValueError(f"--data tfds:{name}: {str(error).strip().splitlines()[0]}") from None
    features = builder.info.features
    texts = sorted(key for key, feature in features.items() if isinstance(feature, tfds.features.Text))
    field = text_field if text_field in texts else (texts[0] if len(texts) == 1 else None)
    if field is None:
        raise ValueError(
            f"tfds:{name} has no text feature {text_field!r}: its text features are {texts}. "
            f"Name one with --text-field. Received: text_field={text_field!r}"
        )
    available = set(builder.info.splits)
    if "train" not in available:
        raise ValueError(f"tfds:{name} has no train split: its splits are {sorted(available)}.")
    given = {"train": "train", "test": "test" if "test" in available else None}
    given["validation"] = next((s for s in _VALIDATION_NAMES if s in available), None)
    train = builder.as_dataset(split="train", shuffle_files=False).map(lambda example: example[field])
    # The split of each train example by its position in TFDS' order, as `TextCorpus` splits documents;
    # a split TFDS provides takes nothing from train.
    codes = holdout_codes(builder.info.splits["train"].num_examples, seed, holdout_fraction)
    for code, split in enumerate(SPLITS):
        if split != "train" and given[split]:
            codes[codes == code] = SPLITS.index("train")
    codes = tf.constant(codes)
    splits = {}
    for code, split in enumerate(SPLITS):
        if split != "train" and given[split]:
            texts_ds = builder.as_dataset(split=given[split], shuffle_files=False).map(lambda example: example[field])
        else:
            texts_ds = train.enumerate().filter(lambda index, _, code=code: tf.equal(tf.gather(codes, index), code))
            texts_ds = texts_ds.map(lambda _, text: text)
        splits[split] = _lines_of(texts_ds, document_starts)
    settings = {"text_field": field, "holdout_fraction": holdout_fraction, "seed": seed}
    settings["holdout_method"] = HOLDOUT_METHOD
    described = {
        "name": builder.info.full_name,
        "splits": {split: given[split] for split in SPLITS},
        "examples": {split: builder.info.splits[split].num_examples for split in sorted(available)},
        "prepared_sha256": prepared_sha256(builder.data_dir),
        **settings,
    }
    sha256 = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
    info = {"dataset": f"tfds:{name}", "source": f"tfds:{builder.info.full_name}", "sha256": sha256}
    return splits, {**info, "corpus": settings}


def load_corpus(
    data="wikitext-2-v1",
    data_dir=None,
    tfds_dir=None,
    validation_data=None,
    test_data=None,
    documents="file",
    text_field="text",
    holdout_fraction=0.05,
    seed=0,
    required_splits=SPLITS,
    document_starts=False,
    holdout_method=HOLDOUT_METHOD,
):
    """The three splits of `data` as `tf.data.Dataset`s of lines, and where they came from.

    Args:
        data: str. A WikiText config (`"wikitext-2-v1"`, ...), `"tfds:NAME[/CONFIG]"`, a `.jsonl`
            or `.ndjson` file, or a glob of plain-text (and JSON Lines) files. Defaults to `"wikitext-2-v1"`.
        data_dir: str or None. WikiText only: a local directory of its files (`load_wikitext`).
        tfds_dir: str or None. Where tensorflow-datasets keeps prepared data.
        validation_data, test_data: str or None. Text files or JSON Lines for a split, instead of
            holding it out of `data`.
        documents: str. Plain text: `"file"` or `"blank-line"` (`TextCorpus`).
        text_field: str. JSON Lines and TFDS only: the field of the text. Defaults to `"text"`; a
            TFDS dataset with a single text feature uses it whatever its name.
        holdout_fraction: float. Share of `data` held out for each split it does not provide.
            Defaults to `0.05`.
        seed: int. Which documents are held out. Defaults to `0`.
        required_splits: the splits of text files or JSON Lines that must hold a document.
            Defaults to all three.
        document_starts: bool. Give `(line, starts_document)` pairs instead of lines: True on the
            first line of each file or blank-line document, JSON record, TFDS example or WikiText
            article (its title line, `= Title =`). Defaults to False.
        holdout_method: str. How documents are held out; a run's recorded settings name it, and
            `HOLDOUT_METHOD` is the only one. Defaults to `HOLDOUT_METHOD`.

    Returns:
        `(splits, info)`: `{"train", "validation", "test"}` datasets of `tf.string` lines, and
        `{"dataset", "source", "sha256"}` (plus `"corpus"`, the split settings, for all but WikiText).

    Raises:
        ValueError: bad input, naming the file and line (`TextCorpus.check`), an unknown TFDS dataset,
            or a missing text feature.
    """
    kind = data_kind(data)
    if kind != "text" and kind != "jsonl" and (validation_data or test_data):
        raise ValueError(
            f"--validation-data and --test-data go with text files or JSON Lines; {data!r} has its own splits. "
            f"Received: validation_data={validation_data!r}, test_data={test_data!r}"
        )
    if holdout_method != HOLDOUT_METHOD:
        raise ValueError(
            f"This elita-tf holds documents out by {HOLDOUT_METHOD!r} only. "
            f"Received: holdout_method={holdout_method!r}"
        )
    if kind == "wikitext" and text_field != "text":
        raise ValueError(
            f"--text-field applies to JSON Lines and TFDS only, and {data!r} is WikiText. "
            f"Received: text_field={text_field!r}"
        )
    if kind == "wikitext":
        splits, info = load_wikitext(data, local_dir=data_dir, tfds_dir=tfds_dir, with_info=True)
        if document_starts:
            splits = {split: lines.map(lambda line: (line, is_article_title(line))) for split, lines in splits.items()}
        return splits, info
    if kind == "tfds":
        return _load_tfds(data[len("tfds:") :], tfds_dir, text_field, holdout_fraction, seed, document_starts)
    corpus = TextCorpus(data, validation_data, test_data, documents, text_field, holdout_fraction, seed, holdout_method)
    checked = corpus.check(required_splits)
    if document_starts:
        signature = (tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.bool))
        read = corpus.lines_with_starts
    else:
        signature, read = tf.TensorSpec([None], tf.string), corpus.lines
    # The generator hands over lines a thousand at a time: one at a time, its per-call cost would cap
    # reading at a few thousand lines a second.
    splits = {
        split: tf.data.Dataset.from_generator(
            lambda split=split: _in_blocks(read(split), document_starts), output_signature=signature
        ).unbatch()
        for split in SPLITS
    }
    info = {"dataset": data, "source": f"{data} ({len(corpus.paths['train'])} files)", "sha256": checked["sha256"]}
    return splits, {**info, "documents": checked["documents"], "corpus": corpus.settings()}
