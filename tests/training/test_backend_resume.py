"""A run resumes on the Keras backend it trained on, and is refused in one line on another."""

import json

from elita_tf.cli.train import main as train_main
from elita_tf.training.run_directory import read_manifest
from tests.backend_utils import BACKEND
from tests.conftest import TINY_RUN, write_documents


def test_a_run_of_another_backend_is_refused_in_one_line_and_left_as_it_was(tmp_path, capsys):
    run = tmp_path / "run"
    data = write_documents(tmp_path / "texts", 30)
    arguments = ["--output-dir", str(run), *TINY_RUN, "--max-steps", "2", "--data", data, "--holdout-fraction", "0.2"]
    assert train_main(arguments) == 0
    assert read_manifest(str(run))["keras_backend"] == BACKEND
    manifest = json.loads((run / "run.json").read_text())
    other = "jax" if BACKEND != "jax" else "torch"
    (run / "run.json").write_text(json.dumps({**manifest, "keras_backend": other}))
    capsys.readouterr()
    assert train_main(arguments) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and f"trained on Keras' {other} backend" in error, error
    assert f"this is {BACKEND}" in error
    assert json.loads((run / "run.json").read_text())["keras_backend"] == other  # nothing changed


def test_a_run_from_before_the_backends_were_recorded_trained_on_tensorflow(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"architecture": "elita"}))
    assert read_manifest(str(tmp_path))["keras_backend"] == "tensorflow"
