"""A run's manifest (`run.json`): what makes a run that run, which a resumed run must match field by field.

{"architecture", "model": the backbone's arguments, "data": {"dataset", "sha256", "corpus"},
 "training": the settings marked "run" in TrainSettings, "keras_backend", "tokenizer_sha256",
 "init_from": {...} and "tokenizer_from" when fine-tuning}
"""

import hashlib
import os

from elita_tf.models.architectures import upgrade_config
from elita_tf.renames import RENAMED, upgrade_arguments
from elita_tf.training.run_files import preset_of
from elita_tf.training.settings import fields_marked


def requested_manifest(settings, config, data):
    """The manifest of the run `settings` asks for, with the model's architecture `config` and its `data`
    (`load_corpus`'s info), without the tokenizer's hash, which the run adds once it has one."""
    import keras  # here: reading a manifest needs no backend

    fine_tuning = {}
    if settings.init_from is not None:
        weights = os.path.join(preset_of(settings.init_from), "model.weights.h5")
        with open(weights, "rb") as f:
            fine_tuning["init_from"] = {
                "preset": os.path.abspath(settings.init_from),
                "weights_sha256": hashlib.file_digest(f, "sha256").hexdigest(),
                "lora_rank": settings.lora_rank,
            }
    if settings.tokenizer_from is not None:
        fine_tuning["tokenizer_from"] = os.path.abspath(settings.tokenizer_from)
    return {
        **fine_tuning,
        "architecture": settings.architecture,
        "model": config,
        # WikiText's record is its name and hash; other text also records how it was split.
        "data": {key: data[key] for key in ("dataset", "sha256", "corpus") if key in data},
        "training": {name: getattr(settings, name) for name in fields_marked("run")},
        # A checkpoint's optimizer state and random streams are its backend's: a run resumes on that backend only.
        "keras_backend": keras.backend.backend(),
    }


def legacy_corpus_record(manifest):
    """The corpus settings of a manifest as written (not upgraded) when they carry an older elita-tf's names, or None.

    The run's data hash covers them as written: the same text, asked for in today's names, hashes otherwise.
    """
    corpus = (manifest.get("data") or {}).get("corpus")
    return corpus if corpus and RENAMED["argument"]["CorpusSettings"].keys() & corpus.keys() else None


def upgrade_manifest(manifest):
    """A manifest written by an older elita-tf, in today's names (the model's and the corpus settings')."""
    manifest = dict(manifest)
    manifest.setdefault("keras_backend", "tensorflow")  # every run before JAX and PyTorch trained on TensorFlow
    if "training" in manifest:  # a run before the setting had byte pieces only where characters did not fit
        manifest["training"] = {"byte_fallback": False, **manifest["training"]}
    if "model" in manifest:
        manifest["model"] = upgrade_config(manifest["model"])
    data = manifest.get("data")
    if data and "corpus" in data:
        corpus = upgrade_arguments("CorpusSettings", data["corpus"])
        corpus.setdefault("data", data["dataset"])
        manifest["data"] = {**data, "corpus": corpus}
    return manifest
