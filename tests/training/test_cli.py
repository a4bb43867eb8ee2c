import csv
import json
import os
import subprocess
import sys
import warnings

import keras
import keras_hub
import numpy as np
import pytest

from elita_tf.cli.compare import main as compare_main
from elita_tf.cli.evaluate import main as evaluate_main
from elita_tf.cli.train import parse_args
from elita_tf.data.token_files import cache_root
from elita_tf.models import ElitaCausalLM
from elita_tf.training import EvaluateSettings, StepLog, evaluate, latest_checkpoint, list_checkpoints
from elita_tf.training import load_latest_checkpoint, preset_of, train
from tests.conftest import PRESET_FILES, TINY_RUN, write_documents

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _args(data_dir, out, *extra):
    return [
        "--data-dir",
        data_dir,
        "--output-dir",
        str(out),
        "--tfds-dir",
        str(out) + "_tfds",
        "--vocabulary-size",
        "60",
        "--sequence-length",
        "16",
        "--batch-size",
        "64",
        "--hidden-dim",
        "16",
        "--num-layers",
        "1",
        "--num-heads",
        "2",
        "--head-dim",
        "8",
        "--epochs",
        "3",
        "--max-steps",
        "12",
        "--checkpoint-every",
        "5",
        "--eval-batches",
        "2",
        "--verbose",
        "0",
        *extra,
    ]


class Interrupt(keras.callbacks.Callback):
    """Kills training (an exception out of fit) after `step` updates."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            raise KeyboardInterrupt("killed")


def _steps(out):
    with open(os.path.join(out, "steps.csv")) as f:
        return [int(row["step"]) for row in csv.DictReader(f)]


def test_train_end_to_end_and_exact_resumption(tiny_wikitext, tmp_path):
    whole = tmp_path / "whole"
    results = train(parse_args(_args(tiny_wikitext, whole)))
    assert results["steps"] == 12 and np.isfinite(results["test_loss"])
    assert results["test_perplexity"] == pytest.approx(np.exp(results["test_loss"]))
    for name in ["run.json", "sentencepiece.model", "checkpoints", "steps.csv", "results.json", "tensorboard"]:
        assert os.path.exists(whole / name), name
    # The trained model is a keras-hub preset in the run's preset/ folder, which holds nothing else.
    assert sorted(os.listdir(whole / "preset")) == PRESET_FILES
    assert preset_of(str(whole)) == str(whole / "preset")
    causal_lm = ElitaCausalLM.from_preset(preset_of(str(whole)))
    assert keras_hub.models.CausalLM.from_preset(str(whole / "preset")).backbone.num_layers == 1
    trained, _ = load_latest_checkpoint(str(whole))
    ids = np.array([[2, 5, 9, 14, 3]], "int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    np.testing.assert_allclose(causal_lm(x), trained(x), rtol=1e-5, atol=1e-5)
    assert causal_lm.generate("the cat", max_length=12).startswith("the cat")
    # elita-evaluate cuts the run's own sequences: the float figure is the run's; int8 is close to it.
    data = {"data_dir": tiny_wikitext, "tfds_dir": str(whole) + "_tfds"}
    cached = sorted(os.listdir(cache_root()))
    evaluated = evaluate(EvaluateSettings(str(whole), eval_batches=2, **data))
    assert evaluated["loss"] == pytest.approx(results["test_loss"], abs=1e-5)
    assert sorted(os.listdir(cache_root())) == cached  # the token files training wrote, read again
    # The run's validation figure is fit's last pass, which the run does not repeat: the same as evaluating it.
    validation = evaluate(EvaluateSettings(str(whole), split="validation", eval_batches=2, **data))["loss"]
    assert validation == pytest.approx(results["validation_loss"], abs=1e-5)
    int8 = evaluate(EvaluateSettings(str(whole), eval_batches=2, quantize="int8", **data))
    assert int8["loss"] == pytest.approx(results["test_loss"], abs=0.05) and int8["loss"] != evaluated["loss"]
    assert (
        evaluate_main(
            ["--run-dir", str(whole), "--split", "validation", "--eval-batches", "1"]
            + [f"--{k.replace('_', '-')}={v}" for k, v in data.items()]
        )
        == 0
    )
    assert [step for step, _ in list_checkpoints(whole)] == [10, 12]  # every 5 and at epoch ends, the last two kept
    assert _steps(whole) == list(range(1, 13))

    # Killed at step 7 (an epoch holds fewer steps: the run crosses an epoch boundary),
    # resumed from the checkpoint at step 5, finished: the same model as without interruption.
    split = tmp_path / "split"
    with pytest.raises(KeyboardInterrupt):
        train(parse_args(_args(tiny_wikitext, split)), callbacks=[Interrupt(7)])
    resumed = train(parse_args(_args(tiny_wikitext, split)))
    assert _steps(split) == list(range(1, 13))
    a = keras.models.load_model(latest_checkpoint(whole))
    b = keras.models.load_model(latest_checkpoint(split))
    for wa, wb in zip(a.weights + a.optimizer.variables, b.weights + b.optimizer.variables):
        np.testing.assert_allclose(wa.numpy(), wb.numpy(), rtol=1e-6, atol=1e-7, err_msg=wa.path)
    assert resumed["test_loss"] == pytest.approx(results["test_loss"], abs=1e-6)


def test_a_run_prints_every_epoch_then_its_table_not_its_json_and_evaluates_no_split_twice(
    tmp_path, capsys, monkeypatch
):
    # `fit` runs one epoch at a time: Keras numbered each out of its own call ("Epoch 2/2", never
    # "Epoch 1/2"), warned that the held-out stream ran out, and the run printed all of results.json.
    texts, out = write_documents(tmp_path / "texts", 30), tmp_path / "run"
    flags = [*TINY_RUN, "--verbose", "1", "--epochs", "2", "--data", texts, "--holdout-fraction", "0.2"]
    evaluations = []
    evaluate_once = ElitaCausalLM.evaluate
    monkeypatch.setattr(ElitaCausalLM, "evaluate", lambda *a, **k: evaluations.append(1) or evaluate_once(*a, **k))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert train(parse_args(["--output-dir", str(out), *flags]))["steps"] > 2
    assert len(evaluations) == 3  # validation after each epoch (the last is the result's), then test
    printed = capsys.readouterr().out
    assert "Epoch 1/2\n" in printed and "Epoch 2/2\n" in printed
    assert not [w for w in caught if "ran out of data" in str(w.message)], [str(w.message) for w in caught]
    lines = printed.splitlines()
    assert lines[-4].startswith("| model |") and lines[-2].startswith("| elita | 0 |"), printed[-2000:]
    assert lines[-1] == f"Everything the run measured: {out / 'results.json'}" and '"config"' not in printed


def test_step_log_writes_each_batch_loss(tmp_path):
    # Keras hands callbacks the epoch's running mean; the log holds each batch's own loss.
    log = StepLog(str(tmp_path / "steps.csv"), start_time=0.0)
    log.set_model(keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]))
    log.model.compile("sgd", "mse")
    log.on_train_begin()
    log.on_epoch_begin(0)
    for batch, running_mean in enumerate([2.0, 1.5, 1.0]):
        log.on_train_batch_begin(batch)
        log.on_train_batch_end(batch, {"loss": running_mean})
    log.on_train_end()
    with open(tmp_path / "steps.csv") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f)]
    np.testing.assert_allclose(losses, [2.0, 1.0, 0.0])


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--architecture", "gpt"], "`architecture` must be one of ['3lin', 'additive', 'additive-reference', 'elita'"),
        (["--sequence-length", "1"], "`sequence_length` must be an integer >= 2. Received: sequence_length=1"),
        (["--batch-size", "0"], "`batch_size` must be a positive integer. Received: batch_size=0"),
        (["--max-steps", "-5"], "`max_steps` must be a positive integer. Received: max_steps=-5"),
        (["--eval-batches", "0"], "Received: eval_batches=0"),
        (["--keep-checkpoints", "0"], "Received: keep_checkpoints=0"),
        (["--hidden-dim", "0"], "Received: hidden_dim=0"),
        (["--dropout", "1.5"], "`dropout` must be in [0, 1). Received: dropout=1.5"),
        (["--seed", "-1"], "`seed` must be a non-negative integer. Received: seed=-1"),
        # numpy's seeds are 32-bit, SentencePiece's and TensorFlow's sizes int32: refused here, not 30 s later.
        (["--seed", "4294967296"], "`seed` must be at most 4294967295. Received: seed=4294967296"),
        (["--vocabulary-size", str(2**31)], "`vocabulary_size` must be at most 2147483647. Received: vocabulary_size="),
        (["--epochs", str(2**63)], "`epochs` must be at most 9223372036854775807. Received: epochs="),
        (["--strategy", "tpu"], "invalid choice: 'tpu'"),
        (["--optimizer", "sgd"], "invalid choice: 'sgd'"),
        (["--architecture", "transformer", "--position-mode", "fixed"], "architecture 'transformer' has none"),
    ],
)
def test_bad_arguments_stop_before_training(tiny_wikitext, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit):
        parse_args(_args(tiny_wikitext, tmp_path / "run", *extra))
    assert message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run")  # nothing written


def test_bad_data_stops_before_training(tmp_path, capsys, tiny_wikitext):
    with pytest.raises(SystemExit):
        parse_args(_args(str(tmp_path / "nowhere"), tmp_path / "run"))
    assert "wiki.train.tokens" in capsys.readouterr().err
    with pytest.raises(ValueError, match="too small for a vocabulary"):
        train(parse_args(_args(tiny_wikitext, tmp_path / "big", "--vocabulary-size", "50000")))
    assert not os.path.exists(tmp_path / "big" / "checkpoints")


MIRRORED = """
import sys, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from elita_tf.cli.train import parse_args
from elita_tf.models import ElitaCausalLM
from elita_tf.cli.compare import main as compare_main
from elita_tf.cli.evaluate import main as evaluate_main
from elita_tf.training import EvaluateSettings, evaluate, train
results = train(parse_args(sys.argv[1:]))
import json; print("RESULT", json.dumps(results))
"""


def test_mirrored_strategy_over_two_cpu_devices(tiny_wikitext, tmp_path):
    args = _args(tiny_wikitext, tmp_path / "mirrored", "--strategy", "mirrored", "--max-steps", "4")
    proc = subprocess.run(
        [sys.executable, "-c", MIRRORED, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert results["replicas"] == 2
    assert results["steps"] == 4 and np.isfinite(results["test_loss"])


def test_compare_cli_end_to_end(tiny_wikitext, tmp_path, capsys):
    out = tmp_path / "compare"
    args = _args(tiny_wikitext, out)
    args = [a for a in args if a not in ("--output-dir", str(out))]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "elita_tf.cli.compare",
            "--architectures",
            "elita",
            "transformer",
            "--output-dir",
            str(out),
            "--seeds",
            "0",
            "1",
            *args,
            "--max-steps",
            "3",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.path.getsize(out / "ELiTA.png") > 10_000
    table = (out / "results.md").read_text()
    assert "| elita | 0, 1 |" in table and "| transformer | 0, 1 |" in table and " ± " in table
    runs = [
        json.loads((out / p / f"seed-{s}" / "results.json").read_text())
        for p in ("elita", "transformer")
        for s in (0, 1)
    ]
    assert [r["seed"] for r in runs] == [0, 1, 0, 1]
    assert runs[0]["test_loss"] != runs[1]["test_loss"]  # the seeds are different runs
    for r in runs:  # what reproduces a figure
        assert r["software"]["tensorflow"] and r["software"]["keras"] and r["software"]["elita_tf"]
        assert r["config"]["model"]["vocabulary_size"] == 60 and r["config"]["settings"]["seed"] == r["seed"]
        assert r["load_average"]["cpus"] >= 1 and r["load_average"]["max"] >= 0


    # Asked again with the same settings, the finished runs are kept; with other settings, refused before
    # any training, in one line naming the setting and the run, never averaged with the new ones.
    same = ["--architectures", "elita", "transformer", "--seeds", "0", "1", "--output-dir", str(out), *args]
    assert compare_main([*same, "--max-steps", "3"]) == 0
    assert capsys.readouterr().out.count("already trained") == 4
    dropout = ["--architectures", "elita", "--output-dir", str(out), *args, "--max-steps", "3", "--dropout", "0.1"]
    assert compare_main(dropout) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out / "elita" / "seed-0") in err and "dropout: stored 0.0, requested 0.1" in err
    assert json.loads((out / "elita" / "seed-0" / "results.json").read_text())["config"]["settings"]["dropout"] == 0.0


def test_compare_never_writes_over_a_table_it_did_not_write(tmp_path):
    from elita_tf.training.compare import compare

    (tmp_path / "results.json").write_text('{"mine": [1, 2]}')
    with pytest.raises(ValueError, match=r"results.json, which elita-compare did not write"):
        compare(str(tmp_path), ["elita"], [0], max_steps=1)
    assert (tmp_path / "results.json").read_text() == '{"mine": [1, 2]}' and not (tmp_path / "elita").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        # One run counted as two seeds (± 0), as a seed twice would be.
        (["--architectures", "elita", "elita"], "`architectures` must be distinct. Received: architectures=['elita',"),
        (["--seeds", "4294967296"], "`seeds` must be at most 4294967295. Received: seeds=4294967296"),
        # The plot is written after all the training: what would fail then is refused now.
        (["--plot", "plot.pnx"], "matplotlib cannot write a .pnx plot: give a file ending in one of"),
        (["--plot", "."], "`plot` is a directory: give the file to write in it"),
        (["--plot", "notes.txt/plot.png"], "notes.txt is not a writable directory. Received: plot=notes.txt/plot.png"),
        (["--data", "notes.txt", "--tfds-dir", "tfds"], "leave --tfds-dir out. Received: tfds_dir='tfds'"),
    ],
)
def test_compare_refuses_before_training(tmp_path, monkeypatch, capsys, extra, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("A note.")
    with pytest.raises(SystemExit):
        compare_main(["--output-dir", "runs", *extra])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_tfds_dir_with_text_files_is_refused(tmp_path, capsys):
    # Text files are read where they are: a --tfds-dir beside them would be ignored without a word.
    (tmp_path / "notes.txt").write_text("A note.")
    with pytest.raises(SystemExit):
        parse_args(["--output-dir", str(tmp_path / "run"), "--data", str(tmp_path / "notes.txt"), "--tfds-dir", "t"])
    assert "leave --tfds-dir out. Received: tfds_dir='t'" in capsys.readouterr().err


def test_a_run_records_the_accelerator_peak_of_its_own_backend(monkeypatch):
    import types

    import tensorflow as tf

    from elita_tf.training.loop import accelerator_peak_mib

    # JAX's and PyTorch's own allocators, as on a GPU, then on a CPU, where there is none to report.
    jax_device = types.SimpleNamespace(platform="gpu", memory_stats=lambda: {"peak_bytes_in_use": 3 * 2**20})
    cuda = types.SimpleNamespace(is_available=lambda: True, max_memory_allocated=lambda: 5 * 2**20)
    monkeypatch.setitem(sys.modules, "jax", types.SimpleNamespace(devices=lambda: [jax_device]))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert accelerator_peak_mib("jax") == 3.0 and accelerator_peak_mib("torch") == 5.0
    jax_device.platform, cuda.is_available = "cpu", lambda: False
    assert accelerator_peak_mib("jax") is None and accelerator_peak_mib("torch") is None
    # TensorFlow's GPU:0, or none on a CPU; JAX and PyTorch are not imported for it (importing them fails here).
    monkeypatch.setitem(sys.modules, "jax", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    on_gpu = bool(tf.config.list_logical_devices("GPU"))
    want = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20 if on_gpu else None
    assert accelerator_peak_mib("tensorflow") == want
