"""One way every command ends on an error: one line, `elita-<command>: error: ...`, exit status 2.

A flag refused while parsing (`ArgumentParser`) and an error of the work (`run_command`) alike; a
traceback is printed only with `--debug`. Ctrl-C ends with the line `interrupted` and, where there
is one, how to resume (a run directory's lock is released on the way out).
"""

import argparse
import subprocess
import sys

DEBUG_HELP = "show the whole traceback of an error instead of its one line"


class ArgumentParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose errors are one line on stderr, `PROG: error: MESSAGE (see --help)`, status 2.

    argparse prints the whole usage before its error line, which buries the
    line under the flags; `--help` still prints the usage.
    """

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(str(message).split())} (see --help)\n")


def run_command(prog, body, debug=False, resume_hint=None):
    """Returns `body()`'s exit status, or 2 (an error) or 130 (Ctrl-C) with one line on stderr.

    Args:
        prog: the command's name, which starts every line.
        body: callable returning the exit status.
        debug: bool. Let the error propagate, with its traceback.
        resume_hint: optional str, said after an interrupt, or a callable
            returning one, called at the interrupt: what can be resumed
            depends on how far the work got.
    """
    try:
        return body()
    except KeyboardInterrupt:
        if debug:
            raise
        hint = resume_hint() if callable(resume_hint) else resume_hint
        print(f"{prog}: interrupted." + (f" {hint}" if hint else ""), file=sys.stderr)
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
