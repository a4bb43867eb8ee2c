"""Every command ends an error on one line (`elita-<cmd>: error: ...`, exit status 2), a traceback only with --debug."""

import errno
import os
import subprocess
import sys

import pytest

from elita_tf.cli.errors import run_command


def _raise(error):
    def body():
        raise error

    return body


@pytest.mark.parametrize(
    "error, line",
    [
        (
            ValueError("bad value.\n  Received: x=1"),
            "elita-x: error: bad value. Received: x=1 (--debug shows the traceback)",
        ),
        (
            OSError(errno.ENOSPC, "No space left on device", "/runs/a/ckpt"),
            "elita-x: error: OSError: [Errno 28] No space left on device: '/runs/a/ckpt' (--debug shows the traceback)",
        ),
        (
            subprocess.CalledProcessError(1, ["elita-train", "--architecture", "elita"]),
            "elita-x: error: `elita-train --architecture elita` failed with exit status 1; its error is above "
            "(--debug shows the traceback)",
        ),
        (PermissionError(errno.EACCES, "Permission denied", "/out"), "elita-x: error: PermissionError: [Errno 13]"),
    ],
)
def test_an_error_is_one_line_with_status_2(error, line, capsys):
    assert run_command("elita-x", _raise(error)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(line) and "Traceback" not in err


def test_debug_lets_the_error_through_and_ctrl_c_says_how_to_resume(capsys):
    with pytest.raises(ValueError, match="bad"):
        run_command("elita-x", _raise(ValueError("bad")), debug=True)
    assert run_command("elita-x", _raise(KeyboardInterrupt()), resume_hint="Run it again to resume.") == 130
    assert capsys.readouterr().err == "elita-x: interrupted. Run it again to resume.\n"
    assert run_command("elita-x", lambda: 0) == 0


def test_a_command_s_error_reaches_the_shell_as_one_line(tmp_path):
    # A real command, in its own process: a run directory that does not exist.
    command = [sys.executable, "-m", "elita_tf.cli.export", "--run-dir", str(tmp_path / "none"), "--output", "x"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("elita-export")]
    assert len(lines) == 1 and lines[0].startswith("elita-export: error: ") and "Traceback" not in done.stderr, (
        done.stderr
    )
