"""The comparison's statistics, checked against values computed by hand."""

import csv
import dataclasses
import json
import os

import pytest

from elita_tf.training.compare import compare
from elita_tf.training.model_settings import complete_settings, resolve_position_mode
from elita_tf.training.settings import train_settings

# Three seeds of one model: test losses 4.0, 4.1, 4.3. By hand: the mean is 12.4 / 3 = 4.13333; the
# squared deviations 0.017778 + 0.001111 + 0.027778 = 0.046667, so the sample standard deviation
# (n - 1) is sqrt(0.046667 / 2) = 0.152753 (the population one would be 0.124722).
LOSSES = {"elita": [4.0, 4.1, 4.3], "transformer": [4.25, 4.25, 4.25]}


def _fake_run(directory, seed, test_loss):
    os.makedirs(directory)
    # What the run trained with, as train records it: compare keeps a finished run of the settings asked for.
    settings = train_settings(output_dir=str(directory), architecture=directory.parent.name, seed=seed)
    settings = resolve_position_mode(complete_settings(settings), str(directory))
    with open(os.path.join(directory, "steps.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "loss", "learning_rate", "wall_time_s", "step_time_s"])
        for step in range(1, 11):
            writer.writerow([step, 8.0 - step * 0.3, 1e-3, step * 2.0, 2.0])
    results = {
        "seed": seed,
        "test_loss": test_loss,
        "test_perplexity": 2.0**test_loss,  # any number: its statistics are taken the same way
        "validation_loss": test_loss + 0.1,
        "step_time_s": 2.0 + seed,
        "tokens_per_s": 1000.0 * (seed + 1),
        "peak_memory_mib": 3000.0,
        "params": 926_000,
        "params_without_embeddings": 286_000,
        "config": {"settings": dataclasses.asdict(settings)},
    }
    with open(os.path.join(directory, "results.json"), "w") as f:
        json.dump(results, f)


def test_the_table_and_results_json_give_the_mean_and_the_sample_standard_deviation(tmp_path):
    out = tmp_path / "compare"
    for name, losses in LOSSES.items():
        for seed, loss in enumerate(losses):
            _fake_run(out / name / f"seed-{seed}", seed, loss)
    # Finished runs are not trained again: compare only plots and tabulates them.
    compare(str(out), ["elita", "transformer"], seeds=[0, 1, 2])
    table = (out / "results.md").read_text()
    assert "| elita | 0, 1, 2 | 926,000 | 286,000 | 4.1333 ± 0.1528 |" in table
    assert "| transformer | 0, 1, 2 | 926,000 | 286,000 | 4.2500 ± 0.0000 |" in table
    assert "| 3.000 ± 1.000 | 2,000 ± 1,000 |" in table  # step time 2, 3, 4 s; tokens/s 1000, 2000, 3000
    summary = json.loads((out / "results.json").read_text())
    assert summary["elita"]["mean"]["test_loss"] == pytest.approx(4.133333, abs=1e-6)
    assert summary["elita"]["sd"]["test_loss"] == pytest.approx(0.152753, abs=1e-6)
    assert summary["elita"]["sd"]["validation_loss"] == pytest.approx(0.152753, abs=1e-6)
    assert summary["elita"]["seeds"] == [0, 1, 2] and summary["transformer"]["sd"]["test_loss"] == 0.0
    assert summary["elita"]["runs"]["seed-2"]["test_loss"] == 4.3
    assert os.path.getsize(out / "ELiTA.png") > 10_000


def test_a_figure_no_run_recorded_is_n_a_in_the_table_and_null_in_results_json(tmp_path):
    # A run of one step times none (its first step, which traces the model, is left out), and a run on a CPU
    # records no GPU peak.
    out = tmp_path / "compare"
    run = out / "elita" / "seed-0"
    _fake_run(run, 0, 4.0)
    results = json.loads((run / "results.json").read_text())
    del results["step_time_s"], results["tokens_per_s"]
    (run / "results.json").write_text(json.dumps(results))
    compare(str(out), ["elita"], seeds=[0])
    table = (out / "results.md").read_text()
    assert "| elita | 0 | 926,000 | 286,000 | 4.0000 | 16.0 | 4.1000 | n/a | n/a | 3,000 |" in table, table
    assert "nan" not in table and "the first step of each epoch" in table.split("\n\n", 1)[1]

    def refuse(constant):  # what a strict JSON reader does with NaN
        raise ValueError(f"not JSON: {constant}")

    summary = json.loads((out / "results.json").read_text(), parse_constant=refuse)
    assert summary["elita"]["mean"]["step_time_s"] is None and summary["elita"]["sd"]["tokens_per_s"] is None
    assert summary["elita"]["mean"]["peak_gpu_memory_mib"] is None and summary["elita"]["mean"]["test_loss"] == 4.0
