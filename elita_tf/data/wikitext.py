"""WikiText (Merity et al. 2016) as a tensorflow-datasets builder, online or from a local directory.

    import tensorflow_datasets as tfds
    import elita_tf.data.wikitext  # registers the builder "wikitext"

    # With internet: downloads from a source that serves WikiText today (`sources.py`), unless
    # ELITA_WIKITEXT_DIR names a directory holding the variant's files.
    splits = tfds.load("wikitext/wikitext-2-v1")
    # Offline: a directory holding wiki.{train,valid,test}.tokens (or .raw), as an argument
    # or in the environment variable ELITA_WIKITEXT_DIR.
    splits = load_wikitext("wikitext-2-v1", local_dir="path/to/wikitext-2")

Each example is one non-empty line of the split file: `{"text": tf.string}`.

Provenance: the prepared dataset records the SHA-256 of its three split files
(`DatasetInfo.metadata["sha256"]`). A local directory is prepared under a
config name that holds that hash, so another directory, or the same one with
edited files, is always prepared afresh and never served from an older cache.
The builder under its own config names (`tfds:wikitext/wikitext-2-v1`) is prepared
once, from ELITA_WIKITEXT_DIR or a download, and kept.
"""

import hashlib
import os

import tensorflow as tf
import tensorflow_datasets as tfds

from elita_tf.data.sources import CONFIG_NAMES, DATA_DIR_ENV, VARIANTS, fetch_wikitext, split_files
from elita_tf.data.sources import SPLIT_FILES as SPLITS
from elita_tf.data.text_files import hash_file, read_lines


class WikitextConfig(tfds.core.BuilderConfig):
    """One WikiText variant (`variant`, a `CONFIG_NAMES` entry): its folder inside the archive and its files' suffix.

    A config of local files is named after their content, and keeps its variant.
    """

    def __init__(self, *, variant, **kwargs):
        kwargs.setdefault("name", variant)
        kwargs.setdefault("description", VARIANTS[variant][2])
        super().__init__(version=tfds.core.Version("1.0.0"), **kwargs)
        self.variant = variant
        self.folder, self.suffix, _ = VARIANTS[variant]


CONFIGS = [WikitextConfig(variant=name) for name in VARIANTS]


def files_sha256(paths):
    """One SHA-256 over the split files `{split: path}`, in split order (hex)."""
    digest = hashlib.sha256()
    for split in SPLITS:
        digest.update(split.encode())
        with open(paths[split], "rb") as f:
            hash_file(digest, f)
    return digest.hexdigest()


def _config(name):
    for config in CONFIGS:
        if config.name == name:
            return config
    raise ValueError(f"Unknown WikiText config. Expected one of {CONFIG_NAMES}. Received: {name!r}")


def _local_dir(variant):
    """The directory `ELITA_WIKITEXT_DIR` names when it holds the files of `variant`, else None."""
    directory = os.environ.get(DATA_DIR_ENV)
    if not directory:
        return None
    try:
        split_files(directory, variant)
    except FileNotFoundError:
        return None
    return os.path.abspath(directory)


class Wikitext(tfds.core.GeneratorBasedBuilder):
    """WikiText language modelling datasets: Wikipedia Good and Featured articles."""

    BUILDER_CONFIGS = CONFIGS
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Offline: put wiki.train.tokens, wiki.valid.tokens and wiki.test.tokens "
        "(.raw for the raw configs) in the manual directory."
    )

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            metadata=tfds.core.MetadataDict(),
            description="WikiText (Merity, Xiong, Bradbury and Socher 2016), CC BY-SA 3.0. One example per line.",
            features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
            homepage="https://arxiv.org/abs/1609.07843",
            # Keep the file's line order: a language model reads articles front to back.
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        try:
            root = source = os.fspath(dl_manager.manual_dir)
        except (AssertionError, ValueError):  # no manual directory given: the offline setting, or download
            root = source = _local_dir(self.builder_config.variant)
            if root is None:
                root, source = fetch_wikitext(self.builder_config, os.fspath(dl_manager.download_dir))
        paths = split_files(root, self.builder_config.variant)
        self.info.metadata["sha256"] = files_sha256(paths)
        self.info.metadata["source"] = source
        return {split: self._generate_examples(path) for split, path in paths.items()}

    def _generate_examples(self, path):
        for number, text in read_lines(path):
            yield number, {"text": text}


# An article's title line, ` = Title = ` once stripped (sections are ` = = Section = = `).
ARTICLE_TITLE = r"= [^=].* ="


def is_article_title(line):
    """Whether a stripped WikiText line (`tf.string`, any shape) starts an article."""
    return tf.strings.regex_full_match(line, ARTICLE_TITLE)


def load_wikitext(config_name="wikitext-2-v1", local_dir=None, tfds_dir=None, with_info=False):
    """The three splits as `tf.data.Dataset`s of lines (`tf.string`).

    Args:
        config_name: one of `CONFIG_NAMES`.
        local_dir: optional directory with the split files (offline).
            Defaults to the environment variable `ELITA_WIKITEXT_DIR`; without
            either, the dataset is downloaded (see `elita_tf.data.sources`).
        tfds_dir: where tensorflow-datasets keeps the prepared dataset.
            Defaults to its own default (`~/tensorflow_datasets`).
        with_info: bool. Also return where the data came from.

    Returns:
        `{"train": ds, "validation": ds, "test": ds}`, and with `with_info`
        also `{"dataset", "source", "sha256"}`: the config, the directory or
        URL read, and the SHA-256 of the three split files.

    Raises:
        FileNotFoundError: when `local_dir` lacks a split file.
        ValueError: when a local split holds no text, or a line that is not UTF-8.
    """
    config = _config(config_name)
    download_config = None
    local_dir = local_dir or os.environ.get(DATA_DIR_ENV) or None
    if local_dir is not None:
        local_dir = os.path.abspath(local_dir)
        paths = split_files(local_dir, config.name)
        for split, path in paths.items():  # fail early, naming the file
            if next(read_lines(path), None) is None:
                raise ValueError(f"The WikiText {split} split is empty ({path}): there is no text to use.")
        download_config = tfds.download.DownloadConfig(manual_dir=local_dir)
        # Keyed by content: a cache prepared from other files is never reused.
        config = WikitextConfig(
            variant=config.variant,
            name=f"{config.name}-local-{files_sha256(paths)[:16]}",
            description=f"{config.description}, from local files",
        )
    builder = Wikitext(config=config, data_dir=tfds_dir)
    builder.download_and_prepare(download_config=download_config)
    datasets = builder.as_dataset(shuffle_files=False)
    splits = {split: datasets[split].map(lambda example: example["text"]) for split in SPLITS}
    if not with_info:
        return splits
    metadata = builder.info.metadata
    return splits, {"dataset": config_name, "source": metadata.get("source"), "sha256": metadata["sha256"]}
