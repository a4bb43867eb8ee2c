"""Every code block of README.md runs, in order, in one directory, on a tiny corpus.

Shell blocks run command by command: the set-up steps (virtual environment, pip, the test run
itself) are what CI's `.ci/run` executes, and are skipped here; every `elita-*` command runs as
written with flags appended that shrink it to the tiny corpus (argparse keeps the last value of a
flag), through the `main` its console script calls, in this process (a fresh interpreter a
command would cost TensorFlow's import each time; tests/training/test_errors.py runs the installed
commands themselves). Python blocks run as written, with `TrainSettings` given the same tiny sizes.
"""

import configparser
import dataclasses
import functools
import importlib
import json
import os
import re
import shlex
import sys

import keras

from elita_tf import training
from tests.conftest import write_documents, write_tiny_wikitext

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
TINY = {
    "vocabulary_size": 60,
    "sequence_length": 16,
    "batch_size": 16,
    "hidden_dim": 16,
    "num_layers": 1,
    "num_heads": 2,
    "head_dim": 8,
    "epochs": 1,
    "max_steps": 2,
    "eval_batches": 1,
    "verbose": 0,
}
# The `main` of each console script (setup.cfg's entry points).
COMMANDS = {
    "elita-train": "elita_tf.cli.train",
    "elita-compare": "elita_tf.cli.compare",
    "elita-evaluate": "elita_tf.cli.evaluate",
    "elita-export": "elita_tf.cli.export",
    "elita-recall": "elita_tf.cli.recall",
}
SHRINK = {
    "elita-train": [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()],
    "elita-compare": [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()],
    "elita-evaluate": ["--eval-batches=1", "--batch-size=2"],
    "elita-export": [],
    "elita-recall": ["--quick"],
}
SET_UP = ("python3 -m venv", ". .venv/bin/activate", "pip install", "python -m pytest", "KERAS_BACKEND=")


def readme_blocks():
    """`[(language, code)]` of README.md's fenced blocks, in order."""
    with open(os.path.join(REPO, "README.md")) as f:
        return re.findall(r"^```(\w+)\n(.*?)^```", f.read(), flags=re.M | re.S)


def shell_commands(code):
    """The commands of a shell block: comments dropped, continued lines joined, `&&` chains split."""
    code = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in code.splitlines():
        line = line.split(" #")[0].strip()
        if line and not line.startswith("#"):
            commands += [part.strip() for part in line.split("&&")]
    return commands


def test_the_readme_has_the_two_set_up_commands_that_ci_runs():
    blocks = [code for language, code in readme_blocks() if language == "bash"]
    with open(os.path.join(REPO, ".ci", "run")) as f:
        ci = f.read()
    main_job, tests, other_backends = blocks[0].strip(), blocks[1].strip(), blocks[2].strip()
    assert main_job.startswith("python3 -m venv .venv") and "elita-compare" in main_job
    assert 'pip install -e ".[test]" && python -m pytest -q -n 2' in tests
    assert tests.split("&& ", 2)[-1] in ci  # CI installs and tests with the README's own command
    assert "KERAS_BACKEND=jax" in other_backends and "KERAS_BACKEND=torch" in other_backends
    assert other_backends in ci


def test_the_jax_example_says_which_install_brings_jax():
    # The example runs as written after the install its sentence names: the `jax` extra, which setup.cfg defines.
    with open(os.path.join(REPO, "README.md")) as f:
        before_example = f.read().split('os.environ["KERAS_BACKEND"] = "jax"')[0].rsplit("```python", 1)[0]
    assert 'pip install -e ".[jax]"' in before_example.strip().rsplit("\n\n", 1)[-1]
    setup = configparser.ConfigParser()
    setup.read(os.path.join(REPO, "setup.cfg"))
    extras = {name: value.split() for name, value in setup["options.extras_require"].items()}
    assert extras["jax"][0].startswith("jax>=") and extras["torch"][0].startswith("torch>=")
    set_up = "\n".join(code for language, code in readme_blocks() if language == "bash")
    assert 'pip install -e ".[jax]"' in set_up and 'pip install -e ".[torch]"' in set_up


def test_the_commands_are_the_console_scripts():
    with open(os.path.join(REPO, "setup.cfg")) as f:
        scripts = dict(re.findall(r"^\s*(elita-[\w-]+) = ([\w.]+):main$", f.read(), flags=re.M))
    assert scripts == COMMANDS


def test_every_readme_block_runs(tmp_path, monkeypatch, capsys):
    data = write_tiny_wikitext(str(tmp_path / "wikitext"))
    # The own-text examples' files, as a user would have them.
    write_documents(tmp_path / "my-texts", 100, seed=0, lines=20)
    write_documents(tmp_path / "new-texts", 100, seed=1, lines=20)
    notes = [{"body": open(path).read()} for path in sorted((tmp_path / "new-texts").iterdir())]
    (tmp_path / "notes.jsonl").write_text("".join(json.dumps(note) + "\n" for note in notes))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", BIN + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("PYTHONPATH", REPO)  # elita-compare's runs, each a process of its own
    monkeypatch.setenv("ELITA_WIKITEXT_DIR", data)
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    # The JAX example sets KERAS_BACKEND, too late for this process's Keras: its processes keep this backend.
    monkeypatch.setenv("KERAS_BACKEND", keras.backend.backend())
    sizes = {k: v for k, v in TINY.items() if k in {f.name for f in dataclasses.fields(training.TrainSettings)}}
    monkeypatch.setattr(training, "TrainSettings", functools.partial(training.TrainSettings, **sizes))
    ran = []
    for language, code in readme_blocks():
        if language == "python":
            exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
            os.environ["KERAS_BACKEND"] = keras.backend.backend()
            ran.append("python")
            continue
        for command in shell_commands(code):
            if command.startswith(SET_UP) or command.startswith("export "):
                continue
            words = shlex.split(command)
            assert words[0] in SHRINK, f"README runs a command this test does not know: {command}"
            extra = SHRINK[words[0]] + (["--sequence-length=32"] if "--sequence-length" in words else [])
            try:
                status = importlib.import_module(COMMANDS[words[0]]).main(words[1:] + extra)
            except SystemExit as stop:  # a flag refused
                status = stop.code
            assert status == 0, f"{command}\n{capsys.readouterr().err[-3000:]}"
            ran.append(words[0])
    assert ran.count("python") == 5 and {"elita-compare", "elita-train", "elita-evaluate", "elita-export"} <= set(ran)
    assert os.path.exists(tmp_path / "runs" / "compare" / "ELiTA.png")  # the quick start's plot, in its own directory
