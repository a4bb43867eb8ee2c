"""The bad-input and fault table of elita-train: each case is refused clearly, or survives, and no
run's files are changed by a refused command."""

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest

from elita_tf.cli.train import main, parse_args
from elita_tf.data import (
    load_wikitext,
    train_sentencepiece,
)
from elita_tf.models import ElitaCausalLM, ElitaTokenizer
from elita_tf.training import (
    CorruptCheckpointError,
    RunDirectory,
    RunDirectoryError,
    latest_checkpoint,
    list_checkpoints,
    preset_of,
    train,
    verify_checkpoint,
)
from elita_tf.training.model_settings import resolve_position_mode
from tests.conftest import TINY_RUN, token_file, write_documents, write_tiny_wikitext
from tests.training.test_cli import REPO, Interrupt, _args


def _run(data_dir, out, *extra, callbacks=()):
    return train(parse_args(_args(data_dir, out, *extra)), callbacks=callbacks)


def _tiny(out, texts, *flags):
    """elita-train on a tiny model of `texts` (`write_documents`); returns its exit status."""
    return main(["--output-dir", str(out), *TINY_RUN, "--data", texts, "--holdout-fraction", "0.2", *flags])


def _greek_corpus(directory):
    words = ["α", "β", "γ", "δ", "ε", "ζ", "η", "θ", "ι", "κ", "λ", "μ"]
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    for stem, count in [("train", 300), ("valid", 40), ("test", 40)]:
        with open(os.path.join(directory, f"wiki.{stem}.tokens"), "w", encoding="utf-8") as f:
            for _ in range(count):
                f.write(" " + " ".join(rng.choice(words, 12)) + " \n")
    return directory


def test_another_data_dir_is_read_not_the_cached_corpus(tiny_wikitext, tmp_path):
    # Once any corpus is prepared in the TFDS directory, another --data-dir used to be ignored.
    tfds_dir = str(tmp_path / "tfds")
    english, info = load_wikitext("wikitext-2-v1", local_dir=tiny_wikitext, tfds_dir=tfds_dir, with_info=True)
    greek_dir = _greek_corpus(str(tmp_path / "greek"))
    greek, greek_info = load_wikitext("wikitext-2-v1", local_dir=greek_dir, tfds_dir=tfds_dir, with_info=True)
    first = next(iter(greek["train"])).numpy().decode()
    assert set(first.split()) <= set("αβγδεζηθικλμ") and greek_info["sha256"] != info["sha256"]
    # Editing the files prepares afresh too.
    with open(os.path.join(greek_dir, "wiki.train.tokens"), "a", encoding="utf-8") as f:
        f.write(" ω ω ω \n")
    edited, edited_info = load_wikitext("wikitext-2-v1", local_dir=greek_dir, tfds_dir=tfds_dir, with_info=True)
    assert edited_info["sha256"] != greek_info["sha256"]
    assert [line.numpy().decode() for line in edited["train"]][-1] == "ω ω ω"


def test_a_directory_holding_another_run_is_refused_untouched(tiny_wikitext, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _run(tiny_wikitext, out, "--architecture", "elita", callbacks=[Interrupt(6)])
    before = {name: (out / name).read_bytes() for name in ["run.json", "sentencepiece.model"]}
    with pytest.raises(
        RunDirectoryError, match=r"(?s)another run.*architecture: stored 'elita', requested 'transformer'"
    ):
        _run(tiny_wikitext, out, "--architecture", "transformer")
    with pytest.raises(RunDirectoryError, match=r"model.vocabulary_size: stored 60, requested 70"):
        _run(tiny_wikitext, out, "--vocabulary-size", "70")
    with pytest.raises(RunDirectoryError, match=r"model.hidden_dim: stored 16, requested 32"):
        _run(tiny_wikitext, out, "--hidden-dim", "32")
    with pytest.raises(RunDirectoryError, match=r"data.sha256"):
        _run(_greek_corpus(str(tmp_path / "greek")), out)
    assert {name: (out / name).read_bytes() for name in before} == before
    # The tokenizer is part of the run: a swapped file is refused, not used.
    (out / "sentencepiece.model").write_bytes(before["sentencepiece.model"][:-10])
    with pytest.raises(RunDirectoryError, match="not the tokenizer this run was trained with"):
        _run(tiny_wikitext, out)
    # --force-new starts over, with the new arguments.
    results = _run(tiny_wikitext, out, "--architecture", "transformer", "--max-steps", "3", "--force-new")
    assert results["architecture"] == "transformer" and results["steps"] == 3
    assert json.loads((out / "run.json").read_text())["architecture"] == "transformer"


def test_files_elita_train_did_not_write_are_never_removed(tiny_wikitext, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "sentencepiece.model").write_bytes(b"someone else's")
    (out / "results.json").write_text('{"mine": 1}')
    for force_new in ([], ["--force-new"]):
        with pytest.raises(RunDirectoryError, match=r"holds results.json, sentencepiece.model but no run.json.*never"):
            _run(tiny_wikitext, out, *force_new)
        assert (out / "sentencepiece.model").read_bytes() == b"someone else's"
        assert (out / "results.json").read_text() == '{"mine": 1}'


def test_a_split_too_small_for_a_batch_stops_before_any_write_and_its_advice_works(tiny_wikitext, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"The validation split .* make no full batch of 640: lower --batch-size"):
        _run(tiny_wikitext, out, "--batch-size", "640")
    assert not out.exists()
    assert _run(tiny_wikitext, out, "--max-steps", "1")["steps"] == 1


def test_a_run_that_saved_no_checkpoint_starts_again_with_other_arguments(tiny_wikitext, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _run(tiny_wikitext, out, "--checkpoint-every", "50", callbacks=[Interrupt(2)])
    assert (out / "run.json").exists() and not list_checkpoints(out)
    capsys.readouterr()
    results = _run(tiny_wikitext, out, "--architecture", "linear", "--max-steps", "2")
    assert "saved no checkpoint: starting it again" in capsys.readouterr().out
    assert (
        results["architecture"] == "linear" and json.loads((out / "run.json").read_text())["architecture"] == "linear"
    )


def test_results_record_the_data_hash(tiny_wikitext, tmp_path):
    results = _run(tiny_wikitext, tmp_path / "run", "--max-steps", "2")
    _, info = load_wikitext("wikitext-2-v1", local_dir=tiny_wikitext, tfds_dir=str(tmp_path / "tfds"), with_info=True)
    assert results["data"]["sha256"] == info["sha256"] and len(info["sha256"]) == 64
    assert results["data"]["source"] == os.path.abspath(tiny_wikitext)


def test_a_corrupt_checkpoint_falls_back_to_the_previous_one(tiny_wikitext, tmp_path):
    whole = _run(tiny_wikitext, tmp_path / "whole")
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _run(tiny_wikitext, out, callbacks=[Interrupt(11)])
    steps = [step for step, _ in list_checkpoints(out)]
    newest = latest_checkpoint(out)
    with open(newest, "r+b") as f:  # truncated on disk: a full disk, a copy cut short
        f.truncate(os.path.getsize(newest) // 2)
    with pytest.raises(CorruptCheckpointError, match="corrupt"):
        verify_checkpoint(newest)
    with pytest.warns(UserWarning, match=rf"{os.path.basename(newest)} is corrupt.*previous checkpoint"):
        resumed = _run(tiny_wikitext, out)
    assert len(steps) == 2 and resumed["test_loss"] == pytest.approx(whole["test_loss"], abs=1e-6)
    # Every checkpoint corrupt: a clear error, not "file not found".
    for _, path in list_checkpoints(out):
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 not really")
    with pytest.warns(UserWarning, match="corrupt"):
        with pytest.raises(CorruptCheckpointError, match="Every checkpoint of this run is corrupt"):
            latest_checkpoint(out)
        assert main(_args(tiny_wikitext, out)) == 2


def test_one_writer_per_run_directory(tiny_wikitext, tmp_path, capsys):
    out = tmp_path / "run"
    holding, release = threading.Event(), threading.Event()

    def other_writer():
        with RunDirectory(str(out)):
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=other_writer)
    thread.start()
    holding.wait(30)
    try:
        with pytest.raises(RunDirectoryError, match=rf"in use by PID {os.getpid()}"):
            _run(tiny_wikitext, out)
    finally:
        release.set()
        thread.join()
    # A lock left by a process killed with -9 (its flock is gone, its PID still written) is taken over.
    (out / ".lock").write_text("PID 999999 on elsewhere, since yesterday")
    _run(tiny_wikitext, out, "--max-steps", "2")
    assert "Taking over the lock" in capsys.readouterr().out
    assert (out / ".lock").read_text() == ""


def test_an_unwritable_output_directory_is_a_clear_error(tiny_wikitext, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(RunDirectoryError, match="Cannot write to the run directory"):
        _run(tiny_wikitext, tmp_path / "file" / "run")


def test_a_line_that_is_not_utf8_names_its_file_and_line(tmp_path):
    data = write_tiny_wikitext(str(tmp_path / "data"))
    path = os.path.join(data, "wiki.valid.tokens")
    with open(path, "ab") as f:
        f.write(b" caf\xe9 latin-1 \n")
    lines = sum(1 for _ in open(path, "rb"))
    with pytest.raises(ValueError, match=rf"wiki.valid.tokens, line {lines}: not UTF-8"):
        load_wikitext("wikitext-2-v1", local_dir=data, tfds_dir=str(tmp_path / "tfds"))


def test_vocabulary_messages_say_which_way_to_go():
    greek = ["α β γ δ ε ζ η θ ι κ λ μ ν ξ ο π ρ σ τ υ"] * 30
    with pytest.raises(
        ValueError, match=r"cannot hold every character.*use at least \d+. Received: vocabulary_size=10"
    ):
        train_sentencepiece(greek, vocabulary_size=10)
    with pytest.raises(ValueError, match=r"too small for a vocabulary of 5000 pieces: use at most \d+"):
        train_sentencepiece(greek, vocabulary_size=5000)


def test_the_pipeline_refuses_ids_the_model_has_no_row_for(tiny_wikitext, tmp_path):
    splits = load_wikitext("wikitext-2-v1", local_dir=tiny_wikitext, tfds_dir=str(tmp_path / "tfds"))
    lines = [line.decode() for line in splits["train"].as_numpy_iterator()]
    tokenizer = ElitaTokenizer(proto=train_sentencepiece(lines, vocabulary_size=60))
    assert token_file(splits["train"], tokenizer, tmp_path / "60", vocabulary_size=60).index["max_id"] < 60
    with pytest.raises(ValueError, match=r"outside the model's vocabulary \[0, 40\)"):
        token_file(splits["train"], tokenizer, tmp_path / "40", vocabulary_size=40)


def test_every_architecture_takes_an_empty_sequence():
    from elita_tf.models import ARCHITECTURES, ElitaBackbone

    for name in sorted(ARCHITECTURES):
        keras.utils.set_random_seed(0)
        backbone = ElitaBackbone.from_architecture(
            name, vocabulary_size=20, hidden_dim=16, num_layers=1, num_heads=2, head_dim=8
        )
        ids = np.zeros((2, 0), "int32")
        assert backbone({"token_ids": ids, "padding_mask": ids}).shape == (2, 0, 20), name


def test_kill_9_mid_run_then_the_same_command_finishes(tiny_wikitext, tmp_path, capsys):
    out = tmp_path / "run"
    args = _args(tiny_wikitext, out, "--checkpoint-every", "2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "elita_tf.cli.train", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not list_checkpoints(out) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert list_checkpoints(out), "the run was killed before its first checkpoint"
    results = _run(tiny_wikitext, out, "--checkpoint-every", "2")
    assert results["steps"] == 12
    with open(out / "steps.csv") as f:
        assert [int(row["step"]) for row in csv.DictReader(f)] == list(range(1, 13))  # no step twice
    assert "Taking over the lock" in capsys.readouterr().out


def test_normalized_sgd_trains_3lin_and_is_part_of_the_run(tiny_wikitext, tmp_path):
    out = tmp_path / "run"
    results = _run(tiny_wikitext, out, "--architecture", "3lin", "--optimizer", "normalized-sgd")
    model = keras.models.load_model(latest_checkpoint(out))
    assert type(model.optimizer).__name__ == "NormalizedSGD"
    # The last tenth of the run decays linearly to 0: at the end the rate is 0.
    assert float(model.optimizer.learning_rate) == pytest.approx(0.0)
    losses = [float(row["loss"]) for row in csv.DictReader(open(out / "steps.csv"))]
    assert np.isfinite(results["test_loss"]) and losses[-1] < losses[0]
    assert results["config"]["settings"]["optimizer"] == "normalized-sgd"
    with pytest.raises(RunDirectoryError, match=r"training.optimizer: stored 'normalized-sgd', requested 'adam'"):
        _run(tiny_wikitext, out, "--architecture", "3lin")


def test_a_normalized_sgd_run_extended_trains_its_new_steps(tmp_path):
    # The checkpoint's schedule ended with the 3-step run: the new steps trained at a rate of 0.
    texts, out = write_documents(tmp_path / "texts", 30), tmp_path / "run"
    flags = ["--architecture", "3lin", "--optimizer", "normalized-sgd"]
    assert _tiny(out, texts, *flags, "--max-steps", "3") == 0
    assert _tiny(out, texts, *flags, "--max-steps", "6") == 0
    with open(out / "steps.csv") as f:
        rates = {int(row["step"]): float(row["learning_rate"]) for row in csv.DictReader(f)}
    # Each row holds the rate its step took (steps.csv held the next step's).
    assert sorted(rates) == list(range(1, 7)) and all(rates[step] > 0 for step in (4, 5, 6)), rates
    model = keras.models.load_model(latest_checkpoint(out))
    assert model.optimizer.get_config()["learning_rate"]["config"]["total_steps"] == 6


def test_a_finished_run_asked_again_keeps_its_results_and_fewer_steps_are_refused(tmp_path, capsys):
    texts, out = write_documents(tmp_path / "texts", 30), tmp_path / "run"
    assert _tiny(out, texts, "--max-steps", "4") == 0
    results = (out / "results.json").read_text()
    capsys.readouterr()
    # Asked again: it says it has finished, and neither evaluates nor rewrites anything.
    assert _tiny(out, texts, "--max-steps", "4") == 0
    printed = capsys.readouterr().out
    assert f"{out} has finished its 4 steps already: nothing to train or evaluate." in printed
    assert "Resuming" not in printed and (out / "results.json").read_text() == results
    # Fewer steps: refused, since its checkpoints and preset are the 4-step model.
    assert _tiny(out, texts, "--max-steps", "2") == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "has trained 4 steps already, more than the 2" in error, error
    assert "--force-new" in error and "Received: max_steps=2" in error
    assert (out / "results.json").read_text() == results and [s for s, _ in list_checkpoints(out)] == [4]
    # Another evaluation: said, and the step time the run measured is kept.
    assert _tiny(out, texts, "--max-steps", "4", "--eval-batches", "1") == 0
    assert f"{out} has finished its 4 steps: evaluating it again." in capsys.readouterr().out
    again, before = json.loads((out / "results.json").read_text()), json.loads(results)
    assert again["steps"] == 4 and again["step_time_s"] == before["step_time_s"]
    assert again["config"]["settings"]["eval_batches"] == 1


def test_mixed_bfloat16_trains_with_float32_weights_and_is_part_of_the_run(tiny_wikitext, tmp_path):
    out = tmp_path / "run"
    results = _run(tiny_wikitext, out, "--dtype-policy", "mixed_bfloat16")
    model = keras.models.load_model(latest_checkpoint(out))
    # Every layer computes in bfloat16 after loading too, the head included (as keras-hub's models; the
    # training loss is float32 by its own path, checked in tests/models).
    assert model.backbone.get_layer("block_0").compute_dtype == "bfloat16"
    assert model.backbone.get_layer("logits").compute_dtype == "bfloat16"
    assert {weight.dtype for weight in model.trainable_weights} == {"float32"}
    losses = [float(row["loss"]) for row in csv.DictReader(open(out / "steps.csv"))]
    assert np.isfinite(results["test_loss"]) and losses[-1] < losses[0]
    assert results["config"]["settings"]["dtype_policy"] == "mixed_bfloat16"
    # The global policy is left as it was.
    assert keras.config.dtype_policy().name == "float32"
    with pytest.raises(RunDirectoryError, match=r"training.dtype_policy: stored 'mixed_bfloat16', requested 'float32'"):
        _run(tiny_wikitext, out)


def test_a_new_run_clamps_its_positions_and_a_resumed_run_keeps_its_own(tiny_wikitext, tmp_path):
    out = tmp_path / "run"
    results = _run(tiny_wikitext, out, "--max-steps", "2")
    assert results["config"]["model"]["position_mode"] == results["config"]["settings"]["position_mode"] == "clamped"
    backbone = ElitaCausalLM.from_preset(preset_of(str(out))).backbone
    assert backbone.get_layer("block_0").mixer.position_mode == "clamped"
    # Another position mode is another architecture: resuming with it stops, naming the field.
    with pytest.raises(RunDirectoryError, match=r"model.position_mode: stored 'clamped', requested 'fixed'"):
        _run(tiny_wikitext, out, "--max-steps", "4", "--position-mode", "fixed")
    # Left to the run, a resumed run keeps the mode it was trained with.
    fixed = tmp_path / "fixed"
    _run(tiny_wikitext, fixed, "--max-steps", "2", "--position-mode", "fixed")
    assert _run(tiny_wikitext, fixed, "--max-steps", "4")["config"]["model"]["position_mode"] == "fixed"
    # Carried-state training trains the positions past the sequence: a new run keeps them running on.
    carried = parse_args(_args(tiny_wikitext, tmp_path / "carried", "--carry-state"))
    assert carried.position_mode is None
    assert resolve_position_mode(carried, carried.output_dir).position_mode == "fixed"
    # The original's positions, which move with the length, are elita-reference's own.
    reference = parse_args(_args(tiny_wikitext, tmp_path / "reference", "--architecture", "elita-reference"))
    assert resolve_position_mode(reference, reference.output_dir).position_mode == "length"
    with pytest.raises(SystemExit):
        parse_args(_args(tiny_wikitext, out, "--position-mode", "sliding"))


def test_a_byte_order_mark_is_not_text(tmp_path):
    from elita_tf.data.text_files import read_lines

    path = tmp_path / "wiki.train.tokens"
    path.write_bytes("\ufeff = Title = \n the cat \ufeff sees \n".encode("utf-8"))
    # At the start of the file it is the encoding's mark; inside a line it stays what it is.
    assert [text for _, text in read_lines(str(path))] == ["= Title =", "the cat \ufeff sees"]


def test_a_failed_checkpoint_write_leaves_no_temporary_file(tmp_path):
    from elita_tf.training import save_checkpoint

    class FullDisk:
        def save(self, path):
            with open(path, "wb") as f:
                f.write(b"half a checkpoint")
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(FullDisk(), str(tmp_path), step=3)
    assert os.listdir(tmp_path / "checkpoints") == []
