"""One way every command ends on an error: one line, `elita-<command>: error: ...`, exit status 2.

A traceback is printed only with `--debug`. Ctrl-C ends with the line `interrupted` and, where
there is one, how to resume (a run directory's lock is released on the way out).
"""

import subprocess
import sys

DEBUG_HELP = "show the whole traceback of an error instead of its one line"


def run_command(prog, body, debug=False, resume_hint=None):
    """Returns `body()`'s exit status, or 2 (an error) or 130 (Ctrl-C) with one line on stderr.

    Args:
        prog: the command's name, which starts every line.
        body: callable returning the exit status.
        debug: bool. Let the error propagate, with its traceback.
        resume_hint: optional str, said after an interrupt.
    """
    try:
        return body()
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted." + (f" {resume_hint}" if resume_hint else ""), file=sys.stderr)
        return 130
    except Exception as error:  # every error reaches the user as one line
        if debug:
            raise
        print(f"{prog}: error: {describe(error)} (--debug shows the traceback)", file=sys.stderr)
        return 2


def describe(error):
    """One line for `error`: our errors' messages as they are, anything else with its type."""
    if isinstance(error, subprocess.CalledProcessError):
        command = " ".join(str(part) for part in error.cmd)
        return f"`{command}` failed with exit status {error.returncode}; its error is above"
    message = " ".join(str(error).split()) or "(no message)"
    return message if isinstance(error, ValueError) else f"{type(error).__name__}: {message}"


def split_debug(argv):
    """`(argv without --debug, whether --debug was given)`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return [arg for arg in argv if arg != "--debug"], "--debug" in argv
