"""Presets: whether a preset (a directory or a handle) is there, whole, and an ELiTA model's.

keras-hub reports a missing or damaged preset file without naming it, and loads any config it is
given; these checks name the file, and refuse a preset of another model before anything loads.
"""

import json
import os

import h5py
import sentencepiece

from elita_tf.models.architectures import REQUIRED_ARGUMENTS, upgrade_config
from elita_tf.renames import warn_renamed

_REGISTERED_NAME = "elita_tf>ElitaBackbone"


def check_preset(preset, load_weights=True):
    """`preset`, once a local one is found whole: a handle is keras-hub's to fetch.

    A directory that is no preset but holds one (an `elita-train` run directory, whose preset is
    its `preset/`) gives that one, with a `FutureWarning` naming it: a run's preset is `preset_of(run)`.

    Raises:
        ValueError: for a name that is neither a directory nor a `scheme://` handle (a keras-hub
            built-in such as `"gemma_2b_en"` is not an ELiTA model).
        FileNotFoundError: for a local preset without its config or weights file.
    """
    if not isinstance(preset, str) or "://" in preset:
        return preset
    if not os.path.isdir(preset):
        raise ValueError(
            "An ELiTA preset is a local directory (one `save_to_preset`, elita-train or `elita-export --format "
            "preset` wrote) or a handle such as kaggle://USER/MODEL/keras/VARIANT or hf://USER/MODEL; elita-tf "
            f"has no built-in presets. Received: preset={preset!r}"
        )
    if not os.path.isfile(os.path.join(preset, "config.json")):
        inside = _preset_inside(preset)
        if inside is not None:
            old, new = "`from_preset` on a run directory", f"its preset {inside!r} (`elita_tf.training.preset_of`)"
            warn_renamed(old, new, f"preset={preset!r}", stacklevel=3)
            preset = inside
    _check_preset_files(preset, load_weights)
    return preset


def _preset_inside(directory):
    """The one folder in `directory` that holds a preset's config (a run directory's preset), or None."""
    found = [entry.path for entry in os.scandir(directory) if os.path.isfile(os.path.join(entry.path, "config.json"))]
    return found[0] if len(found) == 1 else None


def read_preset_config(preset):
    """The `ElitaBackbone` arguments a local preset's `config.json` holds (its `"config"` entry), in today's names.

    Raises:
        ValueError: naming the file, when it is not JSON, not an ELiTA backbone's config (a
            keras-hub preset of another model, say), or lacks an architecture field.
    """
    path = os.path.join(preset, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not JSON ({error}): the preset is damaged.") from None
    if not isinstance(saved, dict) or saved.get("registered_name") != _REGISTERED_NAME:
        kind = saved.get("class_name") if isinstance(saved, dict) else None
        raise ValueError(
            f"{path} is not an ELiTA model's config: its backbone is {kind or 'not named'}, and elita-tf loads "
            f"ElitaBackbone presets only (one `save_to_preset`, elita-train or elita-export wrote). "
            f"Received: class_name={kind!r}"
        )
    config = saved.get("config")
    missing = [name for name in REQUIRED_ARGUMENTS if not isinstance(config, dict) or name not in config]
    if missing:
        raise ValueError(f"{path} lacks the architecture fields {missing}: the preset is damaged or incomplete.")
    return upgrade_config(config)


def saved_mixed_precision(preset):
    """The mixed-precision policy name (`"mixed_bfloat16"`) that a local preset's config holds as its `dtype`, or None.

    A preset saved before the backbone kept that name apart (`mixed_precision_policy`) holds it as
    `dtype`, which keras-hub's `from_preset` reads as a plain dtype and refuses; passed as the
    `dtype` argument instead, it loads.
    """
    if not isinstance(preset, str) or not os.path.isfile(os.path.join(preset, "config.json")):
        return None
    dtype = read_preset_config(preset).get("dtype")
    name = dtype.get("config", {}).get("name") if isinstance(dtype, dict) else dtype
    return name if isinstance(name, str) and name.startswith("mixed_") else None


def _check_preset_files(preset, load_weights):
    """Names the file of a local preset that is missing or unreadable, which keras-hub, h5py and SentencePiece
    would report without its name (or, for the weights, as a sharded index `model.weights.json`)."""
    weights = os.path.join(preset, "model.weights.h5")
    sharded = os.path.isfile(os.path.join(preset, "model.weights.json"))
    for name in ("config.json", *(("model.weights.h5",) if load_weights and not sharded else ())):
        if not os.path.isfile(os.path.join(preset, name)):
            raise FileNotFoundError(f"{preset!r} has no {name}: it is not a keras-hub preset, or an incomplete one.")
    read_preset_config(preset)
    vocabulary = os.path.join(preset, "assets", "tokenizer", "vocabulary.spm")
    if load_weights and not sharded:
        try:
            h5py.File(weights, "r").close()
        except OSError as error:
            raise ValueError(f"{weights} cannot be read (damaged or truncated?): {error}") from None
    if os.path.isfile(vocabulary):
        try:
            sentencepiece.SentencePieceProcessor(model_file=vocabulary)
        except Exception as error:  # its error type varies with sentencepiece's version and the damage
            raise ValueError(f"{vocabulary} cannot be read (damaged or truncated?): {error}") from None
