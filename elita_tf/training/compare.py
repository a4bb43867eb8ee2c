"""Several architectures on the same data and token budget, each with several seeds, then a plot and a table.

    from elita_tf.training.compare import compare
    compare("runs/compare", architectures=["elita", "transformer"], seeds=[0, 1, 2], epochs=2)

Each architecture and seed trains in its own process (`elita-train`, so its peak memory is its
own), one after the other (every architecture's first seed, then every second), under
`OUTPUT_DIR/ARCHITECTURE/seed-S`; a finished run is not trained
again, an interrupted one resumes. Then the plot (each architecture's train loss, averaged over
seeds, against wall-clock time; test losses dashed; insets of average step time and peak memory)
`OUTPUT_DIR/results.md` (mean ± sample standard deviation over the seeds) and
`OUTPUT_DIR/results.json` (the same statistics, and every run's results) are written.
"""

import json
import os
import subprocess
import sys
import time

from elita_tf.models import ARCHITECTURES
from elita_tf.training.plot import plot_comparison, read_run, results_table, summarize
from elita_tf.training.settings import train_settings


def run_dir(output_dir, architecture, seed):
    return os.path.join(output_dir, architecture, f"seed-{seed}")


def train_command(output_dir, architecture, seed, settings):
    """The `elita-train` command of one run; `settings` are `TrainSettings` fields shared by all runs."""
    command = [sys.executable, "-m", "elita_tf.cli.train", "--architecture", architecture, "--seed", str(seed)]
    command += ["--output-dir", run_dir(output_dir, architecture, seed)]
    for name, value in settings.items():
        if value is True:
            command.append(f"--{name.replace('_', '-')}")
        elif value is not None and value is not False:
            command += [f"--{name.replace('_', '-')}", str(value)]
    return command


def _check_outputs(output_dir, default_plot):
    """Raises `ValueError` when `output_dir` holds a table or plot that an earlier comparison did not write.

    A comparison's `results.json` maps each architecture to its statistics and `"runs"`; the
    table and the default plot beside it are written over only with it.
    """
    summary = os.path.join(output_dir, "results.json")
    try:
        with open(summary) as f:
            ours = all(isinstance(entry, dict) and "runs" in entry for entry in json.load(f).values())
    except (OSError, ValueError, AttributeError):
        ours = False
    if ours:
        return
    theirs = [path for path in (summary, os.path.join(output_dir, "results.md"), default_plot) if path]
    theirs = [path for path in theirs if os.path.exists(path)]
    if theirs:
        raise ValueError(
            f"{output_dir} holds {', '.join(theirs)}, which elita-compare did not write, and would write over "
            "them: elita-compare never overwrites files it did not write. Choose another --output-dir, or move "
            "them away."
        )


def compare(output_dir, architectures=("elita", "transformer"), seeds=(0,), plot=None, budget_s=None, **settings):
    """Trains every architecture with every seed (skipping finished runs), then writes the plot and the tables.

    Args:
        output_dir: str. Runs go to `output_dir/ARCHITECTURE/seed-S`.
        architectures: names from `elita_tf.models.ARCHITECTURES`.
        seeds: distinct non-negative ints.
        plot: the PNG to write. Defaults to `output_dir/ELiTA.png`.
        budget_s: float or None. Seconds from the start: a run that the longest run so far says
            would end past them is skipped, never a model's first seed. The runs go seed by seed
            (every model's first seed, then every model's second), so a budget cuts seeds evenly.
        **settings: other `TrainSettings` and `CorpusSettings` fields (`train_settings`), the same for every run.

    Returns:
        `{architecture: [run_dir, ...]}`.
    """
    unknown = [a for a in architectures if a not in ARCHITECTURES]
    if unknown:
        raise ValueError(
            f"Unknown architectures. Expected names from {sorted(ARCHITECTURES)}. Received: architectures={unknown}"
        )
    if any(seed < 0 for seed in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"`seeds` must be distinct non-negative integers. Received: seeds={list(seeds)}")
    train_settings(output_dir=output_dir, **settings)  # refuse bad settings before the first run
    plot_path = plot or os.path.join(output_dir, "ELiTA.png")
    _check_outputs(output_dir, plot is None and plot_path)
    os.makedirs(output_dir, exist_ok=True)
    runs = {name: [] for name in architectures}
    start, longest = time.monotonic(), 0.0
    for seed in seeds:
        for name in architectures:
            directory = run_dir(output_dir, name, seed)
            results = os.path.join(directory, "results.json")
            if os.path.exists(results):
                print(f"{name}, seed {seed}: already trained ({results})", flush=True)
            elif budget_s is not None and runs[name] and time.monotonic() - start + longest > budget_s:
                print(f"{name}, seed {seed}: skipped, it would end past the budget of {budget_s:.0f} s", flush=True)
                continue
            else:
                print(f"{name}, seed {seed}: training", flush=True)
                began = time.monotonic()
                subprocess.run(train_command(output_dir, name, seed, settings), check=True)
                longest = max(longest, time.monotonic() - began)
            runs[name].append(directory)

    plot_comparison(runs, plot_path)
    table = results_table(runs)
    with open(os.path.join(output_dir, "results.md"), "w") as f:
        f.write(table)
    # Each model's statistics over its seeds (those of the table), then every run's own results.
    summary = summarize(runs)
    for name, dirs in runs.items():
        summary[name]["runs"] = {os.path.basename(d): read_run(d)[1] for d in dirs}
    with open(os.path.join(output_dir, "results.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(table)
    print(f"Plot: {plot_path}")
    return runs
