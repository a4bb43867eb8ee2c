"""A run directory's lock, and the check of a resumed run against its manifest (the files are named in `run_files`).

A run directory belongs to one run, written by one process at a time. `run.json` is written once,
when the run starts. Resuming compares the request with it field by field and stops, naming every
difference, before anything in the directory is touched; a run that saved nothing yet (no
checkpoint, results or preset) starts over instead, with a notice. A second writer stops with the
lock holder's PID; a lock left by a killed process is taken over, with a notice.

A run's model loads from its checkpoints (`checkpoints.load_run_model`). No TensorFlow here.
"""

import fcntl
import json
import math
import os
import shutil
import socket
import time

from elita_tf.training.manifest import upgrade_manifest
from elita_tf.training.run_files import (
    ARTEFACTS,
    LOCK_FILE,
    MANIFEST_FILE,
    PRESET_DIR,
    RESULTS_FILE,
    list_checkpoints,
)


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
            lock = open(os.path.join(self.path, LOCK_FILE), "a+")
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
            if exc_type is not None and not os.path.exists(self.file(MANIFEST_FILE)):
                # A run that failed before it started (bad text, say) leaves nothing behind.
                os.remove(self.file(LOCK_FILE))
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
            os.path.exists(self.file(name)) for name in (RESULTS_FILE, PRESET_DIR)
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
                    f"The run directory {self.path!r} holds {', '.join(present)} but no {MANIFEST_FILE}: it is not an "
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
        trained_on, asked = comparable.get("keras_backend"), requested.get("keras_backend")
        if differences and trained_on != asked:
            raise RunDirectoryError(
                f"The run in {self.path!r} trained on Keras' {trained_on} backend, and its checkpoints resume there "
                f"only (KERAS_BACKEND={trained_on}); this is {asked}. Nothing was changed."
            )
        if differences:
            raise RunDirectoryError(
                f"The run directory {self.path!r} holds another run; resuming it with these arguments would mix "
                "two runs. Nothing was changed. Differences:\n  "
                + "\n  ".join(differences)
                + "\nUse the stored run's arguments to resume it, --force-new to discard it, or another --output-dir."
            )
        return stored

    def write_manifest(self, manifest):
        write_atomically(self.file(MANIFEST_FILE), json.dumps(manifest, indent=2, sort_keys=True))


def read_manifest(run_path, upgrade=True):
    """The `run.json` of the run in `run_path`, in today's names (`upgrade_manifest`) unless not `upgrade`, or
    None without one."""
    path = os.path.join(run_path, MANIFEST_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        manifest = json.load(f)
    return upgrade_manifest(manifest) if upgrade else manifest


def results_json(results):
    """`results` (dicts, lists, numbers, strings) as JSON text, each number that is not finite as null.

    NaN and infinities are not JSON: Python writes them, and strict readers
    (JavaScript's, `jq`) refuse the file. Null is a figure not recorded.
    """

    def finite(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(item) for item in value]
        return value

    return json.dumps(finite(results), indent=2, allow_nan=False)


def read_results(run_path):
    """The run's `results.json`, or None before it has one."""
    path = os.path.join(run_path, RESULTS_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
