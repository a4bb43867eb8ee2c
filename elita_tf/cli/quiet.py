"""TensorFlow's start-up without the lines a user of the commands cannot act on.

Importing TensorFlow writes its C++ start-up lines (oneDNN, CPU instructions, CUDA drivers) twice,
once for each library that holds absl's logging, and before `TF_CPP_MIN_LOG_LEVEL` applies to
them; finding no GPU adds `failed call to cuInit`, an error line on every machine without one.
oneDNN adds an error line at the first int64 op, long after start-up. keras-hub imports grain
where it is installed, which warns that it finds no jax profiler (and grain warns of the options
keras-hub reads NumPy arrays with on JAX and PyTorch), and tensorflow-datasets warns of the custom
config that WikiText from local files is.

Those C++ lines are written to the file descriptor, under Python's `sys.stderr`, so the commands'
stderr runs through a filter process from TensorFlow's start to their end (`filter_stderr`). It
copies each line through as it comes: a fatal error, which ends the process as it is written,
still reaches the user, and so does whatever the process wrote before it died.
"""

import atexit
import logging
import os
import re
import select
import stat
import subprocess
import sys

# The level the commands start TensorFlow with unless the user sets their own: warnings and below out.
DEFAULT_LOG_LEVEL = "2"
# A C++ log line: absl's, severity first (date 0000, time 00:00:SECONDS before absl::InitializeLog),
# then thread and file:line]; or the older TensorFlow's, date and time first.
_LOG_LINE = re.compile(
    rb"(?:(?P<severity>[IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+"
    rb"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: (?P<old_severity>[IWEF])) \S+:\d+\] "
)
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}
_FATAL = _SEVERITY[b"F"]
_PREINIT = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# Error lines a user cannot act on: the machine has no GPU (the commands run on the CPU then, as they
# should), TensorFlow 2.19 registering its CUDA plugins twice, with or without a GPU, and oneDNN
# leaving int64 ops to Eigen (its words name AVX-512 whatever the CPU has).
_NOISE = (b"failed call to cuInit", b"Unable to register cuFFT factory", b"Unable to register cuDNN factory")
_NOISE += (b"Unable to register cuBLAS factory",)
_NOISE += (b"only on platforms with AVX-512. Falling back to the default Eigen-based implementation",)
# The second line of cpu_feature_guard's message; any other line that is not absl's is kept.
_CONTINUATION = b"To enable the following instructions"
# A line left unfinished this long (seconds) is copied through as it is: absl writes each of its lines
# at once, so such a line is another writer's (a progress bar), which should not wait for its end.
_UNFINISHED_WAIT = 0.05
# Python's warnings through absl's logger that the commands leave out: keras-hub's fit of NumPy arrays on JAX
# or PyTorch reads them through grain with options that grain warns of at every call.
_PYTHON_NOISE = ("Failed to load jax profiler", "Using custom data configuration: WikitextConfig(")
_PYTHON_NOISE += ("prefetch_buffer_size=8 is smaller than num_threads",)

_filter = None  # (the filter process, the descriptor it writes to, the pipe's inode) once it runs


def _not_noise(record):
    return not record.getMessage().startswith(_PYTHON_NOISE)


def quiet_start_up():
    """Sets `TF_CPP_MIN_LOG_LEVEL` (a user's own setting stays) and drops the Python warnings of `_PYTHON_NOISE`.

    Runs before TensorFlow is imported: TensorFlow reads the level once.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", DEFAULT_LOG_LEVEL)
    logging.getLogger("absl").addFilter(_not_noise)  # added once, however often this runs


def _log_level():
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


class _Lines:
    """Which lines of TensorFlow's stderr are kept at `level`, one line (or a piece of one) at a time.

    A line ends at a line break or a carriage return: a progress bar
    returns to the start of its line, and a log line may follow there.
    """

    def __init__(self, level):
        self.level = level
        self.dropped = False  # the last line's fate, which a continuation line shares
        self.inside = False  # the last piece ended inside its line: this one continues it

    def keep(self, piece):
        if not self.inside:
            match = _LOG_LINE.match(piece)
            if match:
                severity = _SEVERITY[match.group("severity") or match.group("old_severity")]
                noise = self.level >= 2 and any(noise in piece for noise in _NOISE)
                self.dropped = severity < _FATAL and (severity < self.level or noise)
            elif piece.startswith(_PREINIT):
                self.dropped = self.level >= 1
            else:
                self.dropped = self.dropped and piece.startswith(_CONTINUATION)
        self.inside = not piece.endswith((b"\n", b"\r"))
        return not self.dropped


def _pieces(data):
    """`(lines, rest)`: the complete lines of `data` (bytes), each with its end, and what follows the last."""
    *lines, rest = re.split(rb"(?<=[\r\n])", data)
    return lines, rest


def without_noise(text, level):
    """`text` (what TensorFlow wrote to stderr) less its absl lines below `level`.

    At `level` 2 and above the error lines of `_NOISE` (a machine without a
    GPU, say) go too. A fatal line stays at any level, and every line that is
    not absl's is kept (Python's own warnings, say).
    """
    lines, rest = _pieces(text.encode())
    keep = _Lines(level).keep
    return b"".join(piece for piece in lines + [rest] if piece and keep(piece)).decode()


def _write(fd, data):
    while data:
        data = data[os.write(fd, data) :]


def copy_through(source, target, level):
    """Copies file descriptor `source` to `target` until `source` ends, less the lines `without_noise` drops.

    Each line is written as soon as it is complete, and an unfinished one
    after `_UNFINISHED_WAIT` (what is left of it follows as it comes).
    """
    lines, rest = _Lines(level), b""
    while True:
        if rest and not select.select([source], [], [], _UNFINISHED_WAIT)[0]:
            data, rest = (rest if lines.keep(rest) else b""), b""
        else:
            chunk = os.read(source, 1 << 16)
            if not chunk:
                break
            done, rest = _pieces(rest + chunk)
            data = b"".join(piece for piece in done if lines.keep(piece))
        try:
            _write(target, data)
        except OSError:  # no one reads the other end any more: keep reading, so that the writers never wait
            pass
    try:
        _write(target, rest if rest and lines.keep(rest) else b"")
    except OSError:
        pass


def filter_stderr():
    """Runs this process's file descriptor 2 through a filter process (`copy_through`) from here on.

    The filter drops the lines `without_noise` drops at this
    `TF_CPP_MIN_LOG_LEVEL` and copies the rest to where stderr went. At
    Python's exit stderr is given back, once the filter has written all it
    holds; when the process dies without that (a fatal error, a signal),
    the filter writes what it holds as the pipe closes. Where no filter
    process can start, stderr stays as it is.
    """
    global _filter
    if _filter is not None:
        return
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # started without a stderr: nothing to filter
        return
    read, write = os.pipe()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = "import sys; sys.path.insert(0, sys.argv[1]); from elita_tf.cli.quiet import copy_through; "
    code += "copy_through(0, 1, int(sys.argv[2]))"
    try:
        # A session of its own: Ctrl-C stops the command, whose last lines still go through the filter.
        process = subprocess.Popen(
            [sys.executable, "-I", "-c", code, root, str(_log_level())],
            stdin=read,
            stdout=saved,
            stderr=saved,
            start_new_session=True,
        )
    except OSError:
        for fd in (saved, read, write):
            os.close(fd)
        return
    os.close(read)
    os.dup2(write, 2)
    _filter = (process, saved, os.fstat(write).st_ino)
    os.close(write)
    atexit.register(_give_back_stderr)


def _give_back_stderr():
    process, saved, pipe = _filter
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    now = os.fstat(2)
    if stat.S_ISFIFO(now.st_mode) and now.st_ino == pipe:  # still the filter's (a test's capture may replace it)
        os.dup2(saved, 2)  # this process's end of the pipe closes: the filter writes the rest and ends
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # a child process holds the pipe still: the filter ends with it
            pass
    os.close(saved)


def start_tensorflow():
    """Imports TensorFlow and finds its devices, with stderr through the filter from here on (`filter_stderr`).

    Runs before anything else imports TensorFlow: its start-up lines come at the import.
    """
    if "tensorflow" in sys.modules:  # started already: its lines are out
        return
    filter_stderr()
    import tensorflow as tf

    tf.config.list_physical_devices()  # CUDA starts here (cuInit), not at the import
