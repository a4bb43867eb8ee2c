"""A run directory belongs to one run, written by one process at a time.

- `run.json`, the run's manifest: the model's architecture, the training
  settings that shape it, the data's SHA-256 and the tokenizer's. It is
  written once, when the run starts. Resuming compares the request with it
  field by field and stops, naming every difference, before anything in the
  directory is touched; a run that saved nothing yet (no checkpoint, results
  or preset) starts over instead, with a notice.
- `.lock`: held (`flock`) by the process that trains, with its PID inside. A
  second writer stops with that PID; a lock left by a killed process is taken
  over, with a notice.
"""

import fcntl
import json
import os
import shutil
import socket
import time

from elita_tf.models import ElitaCausalLM, ElitaCausalLMPreprocessor, ElitaTokenizer
from elita_tf.models.presets import RUN_MANIFEST, RUN_PRESET
from elita_tf.training.checkpoints import CHECKPOINT_DIR, latest_checkpoint, list_checkpoints, load_checkpoint
from elita_tf.training.manifest import upgrade_manifest

TOKENIZER = "sentencepiece.model"
LOCK = ".lock"
# What a run writes: `--force-new` removes exactly these.
ARTEFACTS = (RUN_MANIFEST, TOKENIZER, "steps.csv", "results.json", CHECKPOINT_DIR, "tensorboard", RUN_PRESET)


class RunDirectoryError(ValueError):
    """The run directory holds another run, or is busy, or cannot be written."""


def write_atomically(path, data):
    """Writes `bytes` or `str` to `path` through a temporary file and a rename."""
    mode = "wb" if isinstance(data, bytes) else "w"
    tmp = f"{path}.tmp"
    with open(tmp, mode) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _flatten(tree, prefix=""):
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}{key}." if isinstance(value, dict) else f"{prefix}{key}"))
    return flat


def manifest_differences(stored, requested):
    """`["field: stored X, requested Y", ...]` over every field of either manifest."""
    a, b = _flatten(stored), _flatten(requested)
    return [
        f"{key}: stored {a.get(key, '(absent)')!r}, requested {b.get(key, '(absent)')!r}"
        for key in sorted(set(a) | set(b))
        if a.get(key) != b.get(key)
    ]


def check_writable(path):
    """Raises `RunDirectoryError` unless `path` is, or can be made as, a writable directory.

    Checked before any data is read: a run that could not write its directory stops at once.
    """
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        reason = "not a directory" if not os.path.isdir(existing) else "permission denied"
        raise RunDirectoryError(
            f"Cannot write to the run directory {path!r}: {existing} is {reason}. Choose a writable --output-dir."
        )


def check_sources_outside(settings):
    """Raises `RunDirectoryError` when the model or tokenizer a run starts from lies in its own output directory.

    Starting the run over (`force_new`) would delete the source before reading it: refused before anything
    is read or removed.
    """
    output = os.path.realpath(settings.output_dir)
    for field in ("init_from", "tokenizer_from"):
        source = getattr(settings, field)
        if source is None or "://" in source:  # a keras-hub handle is downloaded elsewhere
            continue
        if os.path.commonpath([os.path.realpath(source), output]) == output:
            raise RunDirectoryError(
                f"--{field.replace('_', '-')} {source} lies in --output-dir {settings.output_dir}: the run would "
                f"replace the model it starts from. Choose another --output-dir. Received: {field}={source!r}, "
                f"output_dir={settings.output_dir!r}"
            )


class RunDirectory:
    """The output directory of one training run; use as a context manager to hold its lock.

    Args:
        path: the directory (created if needed).
        force_new: bool. Remove an earlier run's files instead of resuming it.

    Example:
    >>> with RunDirectory("runs/elita") as run:  # doctest: +SKIP
    ...     stored = run.check_manifest(requested)
    """

    def __init__(self, path, force_new=False):
        self.path = path
        self.force_new = force_new
        self._lock_file = None

    def __enter__(self):
        self._created = not os.path.exists(self.path)
        try:
            os.makedirs(self.path, exist_ok=True)
            lock = open(os.path.join(self.path, LOCK), "a+")
        except OSError as error:
            raise RunDirectoryError(
                f"Cannot write to the run directory {self.path!r}: {error.strerror}. Choose a writable --output-dir."
            ) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()
            raise RunDirectoryError(
                f"The run directory {self.path!r} is in use by {holder}: one elita-train at a time writes a "
                "run. Wait for it, stop it, or choose another --output-dir."
            ) from None
        lock.seek(0)
        stale = lock.read().strip()
        if stale:
            print(f"Taking over the lock of {self.path!r} from a process that is gone ({stale}).", flush=True)
        lock.seek(0)
        lock.truncate()
        lock.write(f"PID {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        lock.flush()
        self._lock_file = lock
        return self

    def __exit__(self, exc_type, *exc):
        if self._lock_file is not None:
            # Emptied before it is released: a non-empty lock file means its holder died.
            self._lock_file.seek(0)
            self._lock_file.truncate()
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None
            if exc_type is not None and not os.path.exists(self.file(RUN_MANIFEST)):
                # A run that failed before it started (bad text, say) leaves nothing behind.
                os.remove(self.file(LOCK))
                if self._created and not os.listdir(self.path):
                    os.rmdir(self.path)
        return False

    def file(self, name):
        return os.path.join(self.path, name)

    def read_manifest(self):
        """The stored `run.json`, in today's names (`upgrade_manifest`), or None."""
        return read_manifest(self.path)

    def has_progress(self):
        """Whether the run has saved anything worth resuming: a checkpoint, its results or its preset."""
        return bool(list_checkpoints(self.path)) or any(
            os.path.exists(self.file(name)) for name in ("results.json", RUN_PRESET)
        )

    def _remove_run(self, names):
        for name in names:
            path = self.file(name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    def check_manifest(self, requested):
        """Resumes, starts, or refuses, before anything is written.

        Files are removed only where `run.json` says they are a run's, which
        elita-train wrote: with `force_new`, or when a run that never saved a
        checkpoint is asked for again with other arguments (it starts over,
        with a notice).

        Args:
            requested: the manifest of the run asked for (without the
                tokenizer's hash, which the run adds once it has one).

        Returns:
            The stored manifest when resuming the same run, or None for a new
            run (an earlier run's files removed).

        Raises:
            RunDirectoryError: naming every field that differs from a stored
                run that has progress, or the files of a directory without a
                manifest, which are not elita-train's to remove.
        """
        stored = self.read_manifest()
        present = sorted(name for name in ARTEFACTS if os.path.exists(self.file(name)))
        if stored is None:
            if present:
                raise RunDirectoryError(
                    f"The run directory {self.path!r} holds {', '.join(present)} but no {RUN_MANIFEST}: it is not an "
                    "elita-train run, and elita-train never deletes or overwrites files it did not write. Nothing "
                    "was changed. Move those files away, or choose another --output-dir."
                )
            return None
        if self.force_new:
            self._remove_run(present)
            return None
        comparable = {key: value for key, value in stored.items() if key != "tokenizer_sha256"}
        differences = manifest_differences(comparable, requested)
        if differences and not self.has_progress():
            print(f"The run in {self.path!r} saved no checkpoint: starting it again with these arguments.", flush=True)
            self._remove_run(present)
            return None
        if differences:
            raise RunDirectoryError(
                f"The run directory {self.path!r} holds another run; resuming it with these arguments would mix "
                "two runs. Nothing was changed. Differences:\n  "
                + "\n  ".join(differences)
                + "\nUse the stored run's arguments to resume it, --force-new to discard it, or another --output-dir."
            )
        return stored

    def write_manifest(self, manifest):
        write_atomically(self.file(RUN_MANIFEST), json.dumps(manifest, indent=2, sort_keys=True))


def read_manifest(run_path, upgrade=True):
    """The `run.json` of the run in `run_path`, in today's names (`upgrade_manifest`) unless not `upgrade`, or
    None without one."""
    path = os.path.join(run_path, RUN_MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        manifest = json.load(f)
    return upgrade_manifest(manifest) if upgrade else manifest


def _run_preprocessor(run_path):
    """The run's tokenizer in a preprocessor whose `sequence_length` is the training length."""
    with open(os.path.join(run_path, TOKENIZER), "rb") as f:
        tokenizer = ElitaTokenizer(proto=f.read())
    sequence_length = read_manifest(run_path)["training"]["sequence_length"]
    return ElitaCausalLMPreprocessor(tokenizer, sequence_length=sequence_length)


def save_run_preset(model, run_path):
    """Writes `model`'s backbone with the run's tokenizer as a keras-hub preset in `run_path/preset/`."""
    ElitaCausalLM(model.backbone, _run_preprocessor(run_path)).save_to_preset(os.path.join(run_path, RUN_PRESET))


def load_run_model(run_path):
    """The `ElitaCausalLM` of a run's newest intact checkpoint, with the run's tokenizer and preprocessor.

    Raises:
        FileNotFoundError: naming what the directory lacks (manifest, tokenizer or checkpoint).
        CorruptCheckpointError: when every checkpoint is corrupt.
    """
    checkpoint = latest_checkpoint(run_path)
    missing = [os.path.join(run_path, name) for name in (RUN_MANIFEST, TOKENIZER)]
    missing = [path for path in missing if not os.path.exists(path)]
    if checkpoint is None:
        missing.append(os.path.join(run_path, CHECKPOINT_DIR, "step-*.keras"))
    if missing:
        raise FileNotFoundError(f"{run_path!r} is not an elita-train run directory: it lacks {', '.join(missing)}")
    return ElitaCausalLM(load_checkpoint(checkpoint).backbone, _run_preprocessor(run_path))
