"""The names of a run directory's files: every file a training run writes is named here, and only here.

    runs/elita/
      run.json              the manifest (`elita_tf.training.manifest`): architecture, training settings,
                            data and tokenizer hashes
      sentencepiece.model   the tokenizer, trained on the train split
      steps.csv             loss, learning rate and wall time of every step
      tensorboard/          TensorBoard logs
      checkpoints/          step-00000020.keras, ...: model, optimizer (and carried state); the last few kept
      results.json          validation and test loss and perplexity, step time, tokens/s, peak memory,
                            the data's SHA-256, versions and load
      preset/               at the end: the trained model as a keras-hub preset, nothing else
      .lock                 held (`flock`) by the process that trains, with its PID inside

Models know presets only: `preset_of` gives the preset of a run directory (or of a preset), and the
commands and the training code ask it before `from_preset`.

A leaf: it imports nothing of `elita_tf.training`, so the run directory (`run_directory`), its manifest
(`manifest`) and its checkpoints (`checkpoints`) all read their names from here.
"""

import os
import re

from elita_tf.renames import accepts_renamed_arguments

MANIFEST_FILE = "run.json"
TOKENIZER_FILE = "sentencepiece.model"
STEPS_FILE = "steps.csv"
RESULTS_FILE = "results.json"
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
PRESET_DIR = "preset"
LOCK_FILE = ".lock"
# What a run writes: `--force-new` removes exactly these.
ARTEFACTS = (MANIFEST_FILE, TOKENIZER_FILE, STEPS_FILE, RESULTS_FILE, CHECKPOINT_DIR, TENSORBOARD_DIR, PRESET_DIR)
_CHECKPOINT_NAME = re.compile(r"^step-(\d{8})\.keras$")
_PRESET_CONFIG = "config.json"  # keras-hub's: every preset holds one


def checkpoint_path(run_path, step):
    """The path of the checkpoint of `step` (`elita_tf.training.checkpoints` writes and reads it)."""
    return os.path.join(run_path, CHECKPOINT_DIR, f"step-{step:08d}.keras")


@accepts_renamed_arguments
def list_checkpoints(run_path):
    """`[(step, path)]` of the run's checkpoints, oldest first."""
    directory = os.path.join(run_path, CHECKPOINT_DIR)
    if not os.path.isdir(directory):
        return []
    found = [
        (int(m.group(1)), os.path.join(directory, name))
        for name in os.listdir(directory)
        if (m := _CHECKPOINT_NAME.match(name))
    ]
    return sorted(found)


def preset_of(path):
    """The keras-hub preset at `path`: a run directory's `preset/`, else `path` itself, a preset or a handle.

    `from_preset` knows presets only, as keras-hub's does; the commands accept either and ask this first.

    Example:
    >>> ElitaCausalLM.from_preset(preset_of("runs/elita"))  # doctest: +SKIP

    Raises:
        ValueError: for a run that has not finished (it has no preset yet), saying how to export its
            last checkpoint; for a local path that is neither a run directory nor a preset.
    """
    path = os.fspath(path)
    if "://" in path:  # a kaggle:// or hf:// handle: keras-hub fetches it
        return path
    if os.path.isfile(os.path.join(path, MANIFEST_FILE)):
        preset = os.path.join(path, PRESET_DIR)
        if not os.path.isfile(os.path.join(preset, _PRESET_CONFIG)):
            raise ValueError(
                f"{path!r} is an elita-train run that has not finished: its preset is written at the end. "
                f"Resume it with the same elita-train command, or export its last checkpoint with "
                f"`elita-export --run-dir {path} --format preset --output DIR`."
            )
        return preset
    if not os.path.isfile(os.path.join(path, _PRESET_CONFIG)):
        raise ValueError(
            f"{path!r} is neither an elita-train run directory (it has no {MANIFEST_FILE}) nor a keras-hub preset "
            f"(no {_PRESET_CONFIG}). Received: path={path!r}"
        )
    return path
