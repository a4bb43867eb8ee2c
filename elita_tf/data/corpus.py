"""Any training text as three `tf.data` splits of lines: WikiText, a TFDS text dataset, text files or JSON Lines.

    splits, info = load_corpus(CorpusSettings())                                # WikiText-2 (`load_wikitext`)
    splits, info = load_corpus(CorpusSettings("tfds:lm1b"))                     # a TFDS dataset with a text feature
    splits, info = load_corpus(CorpusSettings("books/*.txt", holdout_fraction=0.1), seed=0)
    splits, info = load_corpus(CorpusSettings("corpus.jsonl", text_field="body"))

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

from elita_tf.data.corpus_settings import CorpusSettings
from elita_tf.data.text_files import (
    HOLDOUT_METHOD,
    LINE_END,
    SPACES,
    SPLITS,
    TextCorpus,
    data_kind,
    hash_file,
    holdout_codes,
    split_settings,
)
from elita_tf.data.wikitext import is_article_title, load_wikitext

# Other names TFDS datasets give their validation split.
_VALIDATION_NAMES = ("validation", "valid", "dev")


def _lines_of(texts, document_starts=False):
    """A dataset of texts as one of their non-empty stripped lines (with `document_starts`, `(line, first)` pairs).

    The lines of `text_files.split_lines`: the same `LINE_END`, stripped of the same `SPACES`.
    """
    stripped = f"^[{SPACES}]+|[{SPACES}]+$"

    def lines(text):
        parts = tf.strings.split(tf.strings.regex_replace(text, LINE_END, "\n"), "\n")
        parts = tf.strings.regex_replace(parts, stripped, "")
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
            hash_file(digest, f)
    return digest.hexdigest()


def _tfds_variants(name, tfds_dir):
    """`{config: {version, ...}}` of the TFDS dataset `name` (config None where it has none): those of its
    registered builder and those prepared in the data directories. Empty for a dataset TFDS does not know."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core.utils import file_utils

    variants = {}
    try:
        builder_class = tfds.builder_cls(name)
    except Exception:  # noqa: BLE001 - not registered: perhaps prepared on disk only
        builder_class = None
    for config in getattr(builder_class, "BUILDER_CONFIGS", None) or ([None] if builder_class else []):
        own = config is not None and config.version
        versions = [config.version, *config.supported_versions] if own else [builder_class.VERSION]
        versions += [] if own else list(builder_class.SUPPORTED_VERSIONS)
        variants.setdefault(None if config is None else config.name, set()).update(map(str, versions))
    # Prepared variants: NAME/VERSION/dataset_info.json, or NAME/CONFIG/VERSION/dataset_info.json.
    for data_dir in file_utils.list_data_dirs(tfds_dir):
        root = f"{os.fspath(data_dir).rstrip('/')}/{name}/"
        for pattern in ["*/dataset_info.json", "*/*/dataset_info.json"]:
            for info in tf.io.gfile.glob(root + pattern):
                *config, version, _ = info[len(root) :].split("/")
                if tfds.core.Version.is_valid(version):
                    variants.setdefault(config[0] if config else None, set()).add(version)
    return variants


def _tfds_builder_error(name, tfds_dir, error):
    """What is wrong with `--data tfds:NAME[/CONFIG][:VERSION]` that TFDS could not build: a config or version
    the dataset lacks (with those it has), else the first line of TFDS' own error."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core.naming import parse_builder_name_kwargs

    dataset, kwargs = parse_builder_name_kwargs(name)
    config, version = kwargs.get("config"), kwargs.get("version")
    variants = _tfds_variants(str(dataset), tfds_dir)
    if variants and config is not None and config not in variants:
        return (
            f"--data tfds:{name}: the dataset {dataset} has no config {config!r}: its configs are "
            f"{sorted(map(str, variants))}. Received: config={config!r}"
        )
    versions = variants.get(config, set()) if config is not None else set().union(*variants.values())
    if versions and version is not None and not any(tfds.core.Version(v).match(str(version)) for v in versions):
        where = f"{dataset}/{config}" if config is not None else dataset
        return (
            f"--data tfds:{name}: the dataset {where} has no version {version}: its versions are "
            f"{sorted(versions, key=tfds.core.Version)}. Received: version={str(version)!r}"
        )
    return f"--data tfds:{name}: {str(error).strip().splitlines()[0]}"


def _load_tfds(corpus, seed, document_starts):
    import tensorflow_datasets as tfds

    name, tfds_dir, text_field = corpus.data[len("tfds:") :], corpus.tfds_dir, corpus.text_field
    try:
        builder = tfds.builder(name, data_dir=tfds_dir)
        builder.download_and_prepare()
    except Exception as error:  # noqa: BLE001 - TFDS raises many kinds; the first line says which
        raise ValueError(_tfds_builder_error(name, tfds_dir, error)) from None
    features = builder.info.features
    texts = sorted(key for key, feature in features.items() if isinstance(feature, tfds.features.Text))
    if not texts:
        kinds = ", ".join(f"{key} ({type(feature).__name__})" for key, feature in sorted(features.items()))
        raise ValueError(
            f"tfds:{name} has no text feature (tfds.features.Text) to train on: its features are {kinds}. "
            f"Choose a dataset with one. Received: --data tfds:{name}"
        )
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
    provided = [split for split in SPLITS if given.get(split)]
    codes = tf.constant(
        holdout_codes(builder.info.splits["train"].num_examples, seed, corpus.holdout_fraction, provided)
    )
    splits = {}
    for code, split in enumerate(SPLITS):
        if split != "train" and given[split]:
            texts_ds = builder.as_dataset(split=given[split], shuffle_files=False).map(lambda example: example[field])
        else:
            texts_ds = train.enumerate().filter(lambda index, _, code=code: tf.equal(tf.gather(codes, index), code))
            texts_ds = texts_ds.map(lambda _, text: text)
        splits[split] = _lines_of(texts_ds, document_starts)
    settings = split_settings(corpus, seed, text_field=field)
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


def load_corpus(corpus=None, seed=0, required_splits=SPLITS, document_starts=False):
    """The three splits of a corpus as `tf.data.Dataset`s of lines, and where they came from.

    Args:
        corpus: a `CorpusSettings`: the text and how it is split. Defaults to WikiText-2.
        seed: int. Which documents are held out. Defaults to `0`.
        required_splits: the splits of text files or JSON Lines that must hold a document.
            Defaults to all three.
        document_starts: bool. Give `(line, starts_document)` pairs instead of lines: True on the
            first line of each file or blank-line document, JSON record, TFDS example or WikiText
            article (its title line, `= Title =`). Defaults to False.

    Returns:
        `(splits, info)`: `{"train", "validation", "test"}` datasets of `tf.string` lines, and
        `{"dataset", "source", "sha256"}` (plus `"corpus"`, what decides the splits, for all but
        WikiText: `CorpusSettings.record()`, the seed and the holdout method).

    Raises:
        ValueError: bad input, naming the file and line (`TextCorpus.check`), an unknown TFDS dataset,
            or a missing text feature.
    """
    corpus = CorpusSettings() if corpus is None else corpus
    kind = data_kind(corpus.data)
    if kind == "wikitext":
        splits, info = load_wikitext(corpus.data, local_dir=corpus.data_dir, tfds_dir=corpus.tfds_dir, with_info=True)
        if document_starts:
            splits = {split: lines.map(lambda line: (line, is_article_title(line))) for split, lines in splits.items()}
        return splits, info
    if kind == "tfds":
        return _load_tfds(corpus, seed, document_starts)
    text = TextCorpus(corpus, seed)
    checked = text.check(required_splits)
    if document_starts:
        signature = (tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.bool))
        read = text.lines_with_starts
    else:
        signature, read = tf.TensorSpec([None], tf.string), text.lines
    # The generator hands over lines a thousand at a time: one at a time, its per-call cost would cap
    # reading at a few thousand lines a second.
    splits = {
        split: tf.data.Dataset.from_generator(
            lambda split=split: _in_blocks(read(split), document_starts), output_signature=signature
        ).unbatch()
        for split in SPLITS
    }
    info = {"dataset": corpus.data, "source": f"{corpus.data} ({len(text.paths['train'])} files)"}
    return splits, {**info, "sha256": checked["sha256"], "documents": checked["documents"], "corpus": text.settings()}


def corpus_of_record(dataset, record, data_dir=None, tfds_dir=None):
    """`(CorpusSettings, seed)` of a run's recorded data (`info["dataset"]`, `info.get("corpus")`), read again."""
    record = dict(record or {})
    seed = record.pop("seed", 0)
    # A record without a method comes from before it was recorded, when a SHA-256 threshold held documents out.
    method = record.pop("holdout_method", "sha256-threshold" if record else HOLDOUT_METHOD)
    if method != HOLDOUT_METHOD:
        raise ValueError(
            f"This elita-tf holds documents out by {HOLDOUT_METHOD!r} only: the run's splits cannot be read "
            f"again. Received: holdout_method={method!r}"
        )
    record["data"] = record.get("data", dataset)
    return CorpusSettings(**record, data_dir=data_dir, tfds_dir=tfds_dir), seed
