"""Where a figure came from: the package's version and commit, and the versions it ran on."""

import os
import subprocess
import sys

import keras
import tensorflow as tf


def software_versions():
    """The package version and commit (when it runs from a git checkout), TensorFlow and Keras versions, and the
    Keras backend the run computed on."""
    import elita_tf

    def git(*command):
        source = os.path.dirname(os.path.abspath(elita_tf.__file__))
        return subprocess.run(["git", *command], cwd=source, capture_output=True, text=True, timeout=10)

    try:
        commit = git("rev-parse", "HEAD").stdout.strip()
        if commit and git("diff", "--quiet", "HEAD").returncode:
            commit += "-dirty"  # uncommitted changes: the commit alone does not reproduce the run
    except OSError:
        commit = ""
    return {
        "elita_tf": elita_tf.__version__,
        "commit": commit or None,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "keras_backend": keras.backend.backend(),
        "python": sys.version.split()[0],
    }
