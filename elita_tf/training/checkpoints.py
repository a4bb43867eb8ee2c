"""Checkpoints of a run directory: written atomically, the last few kept, corrupt ones skipped, and the run's
model loaded from the newest intact one (`load_run_model`).

    run_dir/checkpoints/step-00000020.keras
    run_dir/checkpoints/step-00000040.keras    <- newest

(named by `elita_tf.training.run_files`: `checkpoint_path`, `list_checkpoints`)

A checkpoint is a `.keras` file (model and optimizer). Each is written to a
temporary file, flushed to disk and renamed into place, so a crash leaves
either the old file or the new one, never half of one. A file damaged later
(a full disk, a copy cut short) is found by its zip checksums before Keras
reads it; resuming then falls back to the previous checkpoint with a warning.
"""

import os
import warnings
import zipfile

from elita_tf.training.run_directory import read_manifest
from elita_tf.training.run_files import (
    CHECKPOINT_DIR,
    MANIFEST_FILE,
    TOKENIZER_FILE,
    checkpoint_path,
    list_checkpoints,
)


class CorruptCheckpointError(ValueError):
    """A checkpoint file that is not a complete `.keras` archive."""


def verify_checkpoint(path):
    """Raises `CorruptCheckpointError` naming `path` unless it is a complete `.keras` zip archive."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()  # reads every member and checks its CRC
    except (zipfile.BadZipFile, EOFError, OSError) as error:
        raise CorruptCheckpointError(
            f"Checkpoint {path} is corrupt: not a complete .keras archive ({error})."
        ) from None
    if damaged is not None:
        raise CorruptCheckpointError(f"Checkpoint {path} is corrupt: member {damaged!r} fails its checksum.")


def save_checkpoint(model, run_dir, step, keep=2):
    """Writes the model (with its optimizer) as the checkpoint of `step`, then keeps only the newest `keep`.

    Returns:
        The checkpoint's path.
    """
    path = checkpoint_path(run_dir, step)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp.keras"
    try:
        model.save(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: no half-written file is left behind
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    for _, old in list_checkpoints(run_dir)[:-keep]:
        os.remove(old)
    return path


def latest_checkpoint(run_dir):
    """The path of the newest checkpoint that is intact, or None when the run has none.

    Corrupt checkpoints are skipped with a warning that names them.

    Raises:
        CorruptCheckpointError: when checkpoints exist and every one is corrupt.
    """
    found = list_checkpoints(run_dir)
    problems = []
    for _, path in reversed(found):
        try:
            verify_checkpoint(path)
        except CorruptCheckpointError as error:
            problems.append(str(error))
            warnings.warn(f"{error} Falling back to the previous checkpoint.", stacklevel=2)
            continue
        return path
    if problems:
        raise CorruptCheckpointError(
            "Every checkpoint of this run is corrupt, so it cannot resume: " + " ".join(problems)
        )
    return None


def load_checkpoint(path, compile=True):
    """The model (an `ElitaCausalLM`, with its optimizer when `compile`) a checkpoint holds."""
    # Here, not at the top: the checks above need no TensorFlow. The
    # package loads lazily: the classes a checkpoint names are imported so that Keras finds them registered.
    import keras

    import elita_tf.models.elita_causal_lm  # noqa: F401
    import elita_tf.schedules  # noqa: F401  (the learning-rate schedules, and NormalizedSGD)

    return keras.models.load_model(path, compile=compile)


def load_latest_checkpoint(run_dir, compile=True):
    """`(model, path)` from the newest intact checkpoint, or `(None, None)` when there is none."""
    path = latest_checkpoint(run_dir)
    if path is None:
        return None, None
    return load_checkpoint(path, compile=compile), path


def run_preprocessor(proto, sequence_length):
    """A run's one preprocessor: its SentencePiece tokenizer (`proto`, the bytes of `sentencepiece.model`) at
    its training length. `prepare_run` builds it so for training, and `load_run_model` from the run's files."""
    from elita_tf.models import ElitaCausalLMPreprocessor, ElitaTokenizer  # TensorFlow, once a model is built

    return ElitaCausalLMPreprocessor(ElitaTokenizer(proto=proto), sequence_length=sequence_length)


def _run_preprocessor(run_path):
    with open(os.path.join(run_path, TOKENIZER_FILE), "rb") as f:
        proto = f.read()
    return run_preprocessor(proto, read_manifest(run_path)["training"]["sequence_length"])


def load_run_model(run_path):
    """The `ElitaCausalLM` of a run's newest intact checkpoint, with the run's tokenizer and preprocessor.

    Raises:
        FileNotFoundError: naming what the directory lacks (manifest, tokenizer or checkpoint).
        CorruptCheckpointError: when every checkpoint is corrupt.
    """
    from elita_tf.models import ElitaCausalLM

    checkpoint = latest_checkpoint(run_path)
    missing = [os.path.join(run_path, name) for name in (MANIFEST_FILE, TOKENIZER_FILE)]
    missing = [path for path in missing if not os.path.exists(path)]
    if checkpoint is None:
        missing.append(os.path.join(run_path, CHECKPOINT_DIR, "step-*.keras"))
    if missing:
        raise FileNotFoundError(f"{run_path!r} is not an elita-train run directory: it lacks {', '.join(missing)}")
    return ElitaCausalLM(load_checkpoint(checkpoint).backbone, _run_preprocessor(run_path))
