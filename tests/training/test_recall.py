"""`elita-recall` (`elita_tf.training.recall`): the quick grid end to end, resuming, the table and the errors."""

import dataclasses
import json
import os

import pytest

from elita_tf.cli import recall as cli
from elita_tf.training.recall import best_of_sweep, cell_path, decoding_state_bytes, recall_accuracy, recall_backbone
from elita_tf.training.recall_settings import QUICK, RecallSettings
from elita_tf.training.recall_report import recall_table


def test_quick_grid_writes_cells_table_and_plot_and_resumes(tmp_path, capsys):
    output = str(tmp_path / "recall")
    assert cli.main(["--quick", "--output-dir", output]) == 0
    for name in ("recall.md", "recall.json", "recall.png", "recall-state.png"):
        assert os.path.getsize(os.path.join(output, name)) > 0
    with open(os.path.join(output, "recall.json")) as f:
        report = json.load(f)
    assert [r["architecture"] for r in report["best"]] == ["elita", "transformer"]
    for record in report["cells"]:
        assert 0.0 <= record["accuracy"] <= 1.0
        assert record["steps"] > 0 and record["settings"]["seed"] == 0
        assert all(0.0 <= a <= 1.0 for a in record["accuracy_by_epoch"])
    # A finished cell keeps its json only: its last epoch's checkpoint is gone.
    cells = [name for _, folders, files in os.walk(os.path.join(output, "cells")) for name in folders + files]
    assert sorted(name for name in cells if "lr" in name) == ["w16-lr0.003.json"] * 2
    table = open(os.path.join(output, "recall.md")).read()
    assert table.splitlines()[0] == "| model | T=16 P=2 d=16 |"
    assert "| elita | " in table and "| transformer | " in table
    # Run again: every cell is kept, none trained.
    cell = cell_path(output, "elita", 16, 2, 16, 3e-3)
    before = os.stat(cell).st_mtime_ns
    capsys.readouterr()
    assert cli.main(["--quick", "--output-dir", output]) == 0
    assert "2 cells, 2 done, 0 to train" in capsys.readouterr().out
    assert os.stat(cell).st_mtime_ns == before


def test_the_decoding_state_grows_with_the_length_for_attention_alone():
    settings = dataclasses.asdict(RecallSettings(**QUICK))
    size = lambda name, length: decoding_state_bytes(recall_backbone(name, 16, length, settings))  # noqa: E731
    assert size("elita", 32) == size("elita", 16) == size("elita", 4096)
    # Keys and values of 16 more positions (width 16, float32) and their valid flags, in each of the 2 blocks.
    assert size("transformer", 32) - size("transformer", 16) == 2 * 16 * (2 * 16 * 4 + 1)
    assert size("elita-conv", 16) - size("elita", 16) == 2 * 3 * 16 * 4  # the last 3 inputs a block


class _Interrupt(Exception):
    pass


def test_an_interrupted_cell_resumes_at_its_last_epoch_as_if_never_stopped(tmp_path):

    from elita_tf.training.recall import QUICK, RecallSettings, train_cell

    settings = dataclasses.replace(RecallSettings(**QUICK), epochs=3, train_examples=64)
    cell = ("linear", 16, 16, 2, 3e-3, settings)
    whole = train_cell(*cell)

    def stop_after_epoch_2(line):
        if line.startswith("  epoch 2:"):
            raise _Interrupt

    partial = str(tmp_path / "cell.partial")
    with pytest.raises(_Interrupt):
        train_cell(*cell, log=stop_after_epoch_2, checkpoint_dir=partial)
    lines = []
    resumed = train_cell(*cell, log=lines.append, checkpoint_dir=partial)
    assert lines[0].startswith("  resumed after epoch 2") and lines[1].startswith("  epoch 3:")
    # The third epoch starts from the second's weights and optimizer state, as in the run never stopped.
    assert resumed["loss_by_epoch"] == whole["loss_by_epoch"]
    assert resumed["accuracy_by_epoch"] == whole["accuracy_by_epoch"]
    assert resumed["steps"] == whole["steps"] == 3 * 2


def test_accuracy_is_the_share_of_queries_whose_argmax_is_their_value():
    import numpy as np

    from elita_tf.data.mqar import mqar_arrays
    from elita_tf.models import ElitaBackbone, ElitaCausalLM

    backbone = ElitaBackbone.from_architecture(
        "transformer", vocabulary_size=32, num_layers=1, hidden_dim=16, num_heads=2, head_dim=8, max_sequence_length=16
    )
    model = ElitaCausalLM(backbone)
    token_ids, targets, weights = arrays = mqar_arrays(40, 32, 16, 2, seed=0)
    # An untrained model's argmax at the queries, and a target that agrees with it at every other query.
    predicted = np.argmax(model({"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}), axis=-1)
    queries = np.flatnonzero(weights.reshape(-1))
    rigged = targets.reshape(-1).copy()
    rigged[queries[::2]] = predicted.reshape(-1)[queries[::2]]
    rigged[queries[1::2]] = (predicted.reshape(-1)[queries[1::2]] + 1) % 32
    # Everywhere else the targets are the predictions: only the queries may count.
    rigged[weights.reshape(-1) == 0] = predicted.reshape(-1)[weights.reshape(-1) == 0]
    # Batches of 16, the last of 8.
    assert recall_accuracy(model, (token_ids, rigged.reshape(targets.shape), weights), 16) == pytest.approx(0.5)


def _record(architecture, width, learning_rate, accuracy, sequence_length=64, num_pairs=4):
    return {
        "architecture": architecture,
        "width": width,
        "sequence_length": sequence_length,
        "num_pairs": num_pairs,
        "learning_rate": learning_rate,
        "accuracy": accuracy,
    }


def test_the_table_holds_the_best_learning_rate_of_each_cell():
    records = [
        _record("elita", 64, 1e-3, 0.25),
        _record("elita", 64, 3e-3, 0.5),
        _record("elita", 128, 1e-3, 0.75),
        _record("elita", 128, 3e-3, 0.625),
        _record("transformer", 64, 1e-3, 1.0),
        _record("transformer", 64, 3e-3, 0.125),
    ]
    best = best_of_sweep(records)
    assert [(r["architecture"], r["width"], r["accuracy"]) for r in best] == [
        ("elita", 64, 0.5),
        ("elita", 128, 0.75),
        ("transformer", 64, 1.0),
    ]
    lines = recall_table(best).splitlines()
    assert lines[0] == "| model | T=64 P=4 d=64 | T=64 P=4 d=128 |"
    assert lines[2] == "| elita | 0.500 (lr 0.003) | 0.750 (lr 0.001) |"
    assert lines[3] == "| transformer | 1.000 (lr 0.001) |  |"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--tasks", "64:40"], "Received: num_pairs=40"),
        (["--tasks", "64"], "Received: '64'"),
        (["--architectures", "nope"], "Received: name='nope'"),
        (["--widths", "30", "--num-heads", "4"], "Received: widths=[30]"),
        *[([f"--{f}", "0"], f"Received: {f.replace('-', '_')}=0") for f in ("num-heads", "batch-size", "epochs")],
        (["--train-examples", "10"], "at least batch_size = 64: a step an epoch. Received: train_examples=10"),
        (["--widths", "-16"], "Received: widths=-16"),
        (["--learning-rates", "0"], "Received: learning_rates=0.0"),
        (["--time-limit", "-1"], "Received: time_limit=-1.0"),
        (["--protocol", "gpu"], "invalid choice: 'gpu'"),
    ],
)
def test_bad_flags_end_in_one_line(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--output-dir", str(tmp_path), *flags])
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("elita-recall: error: ") and message in error and error.count("\n") == 1


def test_every_flag_has_help_and_the_old_settings_flag_sets_tasks(capsys):

    from elita_tf.training.recall_settings import RecallSettings

    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for field in dataclasses.fields(RecallSettings):
        flag = "--" + field.name.replace("_", "-")
        assert f"{flag} " in text and field.metadata["help"].split()[0].strip("`") in text, flag
    assert "Default: 64:4 128:8" in text
    _, _, settings, _ = cli.parse_args(["--output-dir", "x", "--settings", "64:8"])
    assert settings.tasks == ((64, 8),) and "--settings is deprecated: use --tasks" in capsys.readouterr().err
    with pytest.warns(FutureWarning, match="use `tasks`"):
        assert RecallSettings(settings=[(64, 8)]).tasks == ((64, 8),)


def _quick_cell(output, **changes):
    """Trains `--quick`'s ELiTA cell into `output` (with `changes` to its settings); returns the cell's path."""

    from elita_tf.training.recall import QUICK, RecallSettings, recall_grid

    settings = dataclasses.replace(RecallSettings(**QUICK), **changes)
    recall_grid(output, ["elita"], settings, log=lambda line: None)
    return cell_path(output, "elita", 16, 2, 16, 3e-3), settings


def test_a_cell_of_other_settings_is_refused_and_a_damaged_one_named(tmp_path):

    from elita_tf.training.recall import recall_grid

    output = str(tmp_path / "recall")
    path, settings = _quick_cell(output)
    for changes, message in [
        ({"epochs": 4, "vocabulary_size": 64}, "was trained with epochs=1, vocabulary_size=32; these settings have "
         "epochs=4, vocabulary_size=64"),
        ({"seed": 1}, "was trained with seed=0; these settings have seed=1"),
    ]:
        with pytest.raises(ValueError, match=message):
            recall_grid(output, ["elita"], dataclasses.replace(settings, **changes), log=lambda line: None)
    # Another grid of the same cells' settings reuses them.
    recall_grid(output, ["elita"], dataclasses.replace(settings, widths=(16,)), log=lambda line: None)
    with open(path, "w") as f:
        f.write("{")
    with pytest.raises(ValueError, match=f"{path} is not a finished cell's record \\(not json"):
        recall_grid(output, ["elita"], settings, log=lambda line: None)


def test_a_partial_cell_of_other_settings_is_refused(tmp_path):

    from elita_tf.training.recall import QUICK, RecallSettings, train_cell

    settings = dataclasses.replace(RecallSettings(**QUICK), epochs=2, train_examples=64)
    partial = str(tmp_path / "cell.partial")

    def stop_after_epoch_1(line):
        if line.startswith("  epoch 1:"):
            raise _Interrupt

    with pytest.raises(_Interrupt):
        train_cell("linear", 16, 16, 2, 3e-3, settings, log=stop_after_epoch_1, checkpoint_dir=partial)
    with pytest.raises(ValueError, match="cell.partial was trained with epochs=2; these settings have epochs=3"):
        train_cell("linear", 16, 16, 2, 3e-3, dataclasses.replace(settings, epochs=3), checkpoint_dir=partial)


def test_zoologys_protocol_sets_its_defaults_and_its_model():
    from elita_tf.training.recall_settings import CPU_LEARNING_RATES, ZOOLOGY, ZOOLOGY_LEARNING_RATES

    _, architectures, settings, time_limit = cli.parse_args(["--output-dir", "x", "--protocol", "zoology"])
    assert settings == RecallSettings(**ZOOLOGY) and time_limit is None
    assert [round(rate, 7) for rate in ZOOLOGY_LEARNING_RATES] == [1e-4, 4.642e-4, 2.1544e-3, 1e-2]
    assert settings.learning_rates == ZOOLOGY_LEARNING_RATES and settings.widths == (64, 128, 256, 512)
    assert [settings.batch_size_at(t) for t in (64, 128, 256, 512, 1024)] == [512, 512, 256, 128, 64]
    assert RecallSettings().batch_size_at(256) == 64 and RecallSettings().learning_rates == CPU_LEARNING_RATES
    # --quick's sizes under Zoology's rules; a flag given wins over both.
    _, _, quick, _ = cli.parse_args(["--output-dir", "x", "--protocol", "zoology", "--quick", "--epochs", "2"])
    assert quick == RecallSettings(**(QUICK | {"protocol": "zoology", "random_non_queries": False, "epochs": 2}))
    # Zoology's model: no feed-forward network, tied embeddings, dropout, learned positions for softmax attention.
    zoology, cpu = dataclasses.asdict(quick), dataclasses.asdict(RecallSettings(**QUICK))
    for name, positions in [("transformer", True), ("simplified", True), ("elita-hybrid", True), ("elita", False)]:
        config = recall_backbone(name, 16, 16, zoology).get_config()
        assert (config["ffn"], config["tie_word_embeddings"], config["dropout"]) == ("none", True, 0.1), name
        assert config["position_embedding"] is positions, name
    for name in ("linear", "linear-conv", "additive"):  # learned positions under the cpu protocol, none here
        assert recall_backbone(name, 16, 16, cpu).position_embedding
        assert not recall_backbone(name, 16, 16, zoology).position_embedding
    assert recall_backbone("transformer", 16, 16, cpu).get_config()["ffn"] == "mlp"


def test_each_epoch_is_whole_batches_in_an_order_of_the_seed_and_the_epoch():
    import numpy as np

    from elita_tf.data.mqar import mqar_arrays
    from elita_tf.training.recall import epoch_arrays

    task = dict(vocabulary_size=32, sequence_length=16, num_pairs=2)
    cpu = dataclasses.replace(RecallSettings(**QUICK), train_examples=100)
    zoology = dataclasses.replace(cpu, protocol="zoology")
    fixed = mqar_arrays(100, seed=(0, 0), **task)
    first, again = epoch_arrays(zoology, 0, 32, fixed, **task), epoch_arrays(zoology, 0, 32, fixed, **task)
    second = epoch_arrays(zoology, 1, 32, fixed, **task)
    assert all(a.shape[0] == 96 and np.array_equal(a, b) for a, b in zip(first, again))  # 3 whole batches of 32
    # Zoology's: the fixed set's rows, in another order each epoch.
    rows = {tuple(row) for row in fixed[0]}
    assert {tuple(row) for row in first[0]} <= rows and {tuple(row) for row in second[0]} <= rows
    assert not np.array_equal(first[0], second[0])
    # The cpu protocol's: new sequences each epoch.
    new = epoch_arrays(cpu, 1, 32, **task)
    assert not {tuple(row) for row in new[0]} & {tuple(row) for row in epoch_arrays(cpu, 0, 32, **task)[0]}


def test_a_cell_recorded_before_protocols_is_the_cpu_protocols_and_a_time_limit_reports_what_is_done(tmp_path):
    from elita_tf.training.recall import recall_grid

    output = str(tmp_path / "recall")
    path, settings = _quick_cell(output)
    with open(path) as f:
        record = json.load(f)
    del record["settings"]["protocol"]  # as written before the field
    with open(path, "w") as f:
        json.dump(record, f)
    lines = []
    recall_grid(output, ["elita"], settings, log=lines.append)
    assert lines[0].startswith("1 cells, 1 done, 0 to train")
    with pytest.raises(ValueError, match="was trained with protocol='cpu'; these settings have protocol='zoology'"):
        recall_grid(output, ["elita"], dataclasses.replace(settings, protocol="zoology"), log=lines.append)
    # No cell starts after the limit; the report holds the finished ones.
    lines = []
    report = recall_grid(output, ["elita", "transformer"], settings, log=lines.append, time_limit=0)
    assert [r["architecture"] for r in report["cells"]] == ["elita"]
    assert "time limit of 0 s: 1 cells not started" in lines[-1]
