"""`elita-train`, `elita-evaluate` and `elita-compare` on JAX or PyTorch: a complete run directory, whose preset
exports to LiteRT under TensorFlow and scores there what the run's own backend scores: its test loss, in sequences
and as one stream; and a comparison's runs, each trained on that backend."""

import json
import os

import pytest

from elita_tf.cli.train import main as train_main
from elita_tf.training import EvaluateSettings, evaluate
from tests.backend_utils import BACKEND, run_on_backend
from tests.conftest import TINY_RUN, write_documents

_ON_TENSORFLOW = """
import contextlib, io, json, sys
from elita_tf.cli.evaluate import main as evaluate
from elita_tf.cli.export import main as export
run, litert = sys.argv[1:]
assert export(["--run-dir", run, "--format", "litert", "--output", litert]) == 0
losses = []
for extra in ([], ["--litert", litert], ["--carry-state", "--eval-batches", "3"]):
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        assert evaluate(["--run-dir", run, "--split", "test", *extra]) == 0
    losses.append(json.loads(report.getvalue())["loss"])
print(json.dumps(losses))
"""


@pytest.mark.skipif(BACKEND == "tensorflow", reason="elita-train's own tests run on TensorFlow")
def test_a_run_here_is_complete_and_scores_its_test_loss_under_tensorflow_and_litert(tmp_path):
    pytest.importorskip("ai_edge_litert")
    run = tmp_path / "run"
    data = write_documents(tmp_path / "texts", 40)
    arguments = ["--output-dir", str(run), *TINY_RUN, "--max-steps", "3", "--data", data, "--holdout-fraction", "0.15"]
    assert train_main(arguments) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["software"]["keras_backend"] == BACKEND and results["steps"] == 3
    assert {"preset", "checkpoints", "sentencepiece.model", "steps.csv", "run.json"} <= set(os.listdir(run))
    here = evaluate(EvaluateSettings(str(run), verbose=0))
    stream = evaluate(EvaluateSettings(str(run), carry_state=True, eval_batches=3, verbose=0))
    assert here["loss"] == pytest.approx(results["test_loss"], rel=1e-5) and stream["tokens"] == 3 * 16
    scored = run_on_backend("tensorflow", _ON_TENSORFLOW, run, tmp_path / "model.tflite")
    losses = json.loads(scored.strip().splitlines()[-1])  # TensorFlow's, the LiteRT file's, TensorFlow's stream
    assert losses == pytest.approx([results["test_loss"]] * 2 + [stream["loss"]], rel=1e-5)


@pytest.mark.skipif(BACKEND == "tensorflow", reason="elita-compare's own tests run on TensorFlow")
def test_compare_trains_every_architecture_on_this_backend_and_tables_them(tmp_path):
    from elita_tf.cli.compare import main as compare_main

    out = tmp_path / "compare"
    data = write_documents(tmp_path / "texts", 40)
    arguments = ["--output-dir", str(out), *TINY_RUN, "--max-steps", "2", "--data", data, "--holdout-fraction", "0.15"]
    assert compare_main([*arguments, "--architectures", "elita", "transformer", "--seeds", "0"]) == 0
    table = (out / "results.md").read_text()
    assert "| elita | 0 |" in table and "| transformer | 0 |" in table
    for name in ("elita", "transformer"):  # each run trained here, in its own process
        results = json.loads((out / name / "seed-0" / "results.json").read_text())
        assert results["software"]["keras_backend"] == BACKEND and results["steps"] == 2


_RECALL_ON_TENSORFLOW = """
import json, sys
from elita_tf.data.mqar import mqar_arrays
from elita_tf.training.checkpoints import load_checkpoint
from elita_tf.training.recall import QUICK, RecallSettings, recall_accuracy
settings = RecallSettings(**QUICK)
task = dict(vocabulary_size=settings.vocabulary_size, sequence_length=16, num_pairs=2)
test = mqar_arrays(settings.test_examples, seed=(settings.seed, 1), **task)
print(json.dumps(recall_accuracy(load_checkpoint(sys.argv[1]), test, settings.batch_size)))
"""


@pytest.mark.skipif(BACKEND == "tensorflow", reason="elita-recall's own tests run on TensorFlow")
def test_a_recall_cell_trains_here_and_tensorflow_scores_its_weights_alike(tmp_path):
    from elita_tf.training.recall import QUICK, RecallSettings, train_cell
    from elita_tf.training.run_files import checkpoint_path

    partial = tmp_path / "cell.partial"  # its last epoch's checkpoint stays there
    record = train_cell("elita", 16, 16, 2, 3e-3, RecallSettings(**QUICK), checkpoint_dir=str(partial))
    assert record["backend"] == BACKEND and record["steps"] == 4 and 0 <= record["accuracy"] <= 1
    scored = run_on_backend("tensorflow", _RECALL_ON_TENSORFLOW, checkpoint_path(str(partial), 1))
    assert json.loads(scored.strip().splitlines()[-1]) == record["accuracy"]
