"""TensorFlow's start-up without the lines a user of the commands cannot act on.

Importing TensorFlow writes its C++ start-up lines (oneDNN, CPU instructions, CUDA drivers) twice,
once for each library that holds absl's logging, and before `TF_CPP_MIN_LOG_LEVEL` applies to
them; finding no GPU adds `failed call to cuInit`, an error line on every machine without one.
keras-hub imports grain where it is installed, which warns that it finds no jax profiler.
"""

import logging
import os
import re
import sys
import tempfile

# The level the commands start TensorFlow with unless the user sets their own: warnings and below out.
DEFAULT_LOG_LEVEL = "2"
# A C++ log line: absl's, severity first (date 0000, time 00:00:SECONDS before absl::InitializeLog),
# then thread and file:line]; or the older TensorFlow's, date and time first.
_LOG_LINE = re.compile(
    r"(?:(?P<severity>[IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: (?P<old_severity>[IWEF])) \S+:\d+\] "
)
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_PREINIT = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# Error lines a user cannot act on: the machine has no GPU (the commands run on the CPU then, as they
# should), and TensorFlow 2.19 registering its CUDA plugins twice, with or without a GPU.
_NOISE = ("failed call to cuInit", "Unable to register cuFFT factory", "Unable to register cuDNN factory")
_NOISE += ("Unable to register cuBLAS factory",)
# The second line of cpu_feature_guard's message; any other line that is not absl's is kept.
_CONTINUATION = "To enable the following instructions"


def _not_jax_profiler(record):
    return not record.getMessage().startswith("Failed to load jax profiler")


def quiet_start_up():
    """Sets `TF_CPP_MIN_LOG_LEVEL` (a user's own setting stays) and drops grain's jax profiler warning.

    Runs before TensorFlow is imported: TensorFlow reads the level once.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", DEFAULT_LOG_LEVEL)
    logging.getLogger("absl").addFilter(_not_jax_profiler)  # added once, however often this runs


def _log_level():
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def without_noise(text, level):
    """`text` (what TensorFlow's start-up wrote to stderr) less its absl lines below `level`.

    At `level` 2 and above the error lines of a machine without a GPU go
    too. Every line that is not absl's is kept (Python's own warnings, say).
    """
    kept, dropped = [], False
    for line in text.splitlines(keepends=True):
        match = _LOG_LINE.match(line)
        if match:
            severity = _SEVERITY[match.group("severity") or match.group("old_severity")]
            dropped = severity < level or (level >= 2 and any(noise in line for noise in _NOISE))
        elif line.startswith(_PREINIT):
            dropped = level >= 1
        else:
            dropped = dropped and line.startswith(_CONTINUATION)
        if not dropped:
            kept.append(line)
    return "".join(kept)


def start_tensorflow():
    """Imports TensorFlow and finds its devices, its start-up lines below `TF_CPP_MIN_LOG_LEVEL` left out.

    Those lines come from C++, under Python's `sys.stderr`: the file
    descriptor is read for the while, and what is not noise written back.
    """
    if "tensorflow" in sys.modules:  # started already: its lines are out
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()  # CUDA starts here (cuInit), not at the import
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            sys.stderr.write(without_noise(captured.read().decode(errors="replace"), _log_level()))
            sys.stderr.flush()
