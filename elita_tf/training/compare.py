"""Several architectures on the same data and token budget, each with several seeds, then a plot and a table.

    from elita_tf.training.compare import compare
    compare("runs/compare", architectures=["elita", "transformer"], seeds=[0, 1, 2], epochs=2)

Each architecture and seed trains in its own process (`elita-train`, so its peak memory is its
own), one after the other (every architecture's first seed, then every second), under
`OUTPUT_DIR/ARCHITECTURE/seed-S`; a finished run is not trained
again (a finished run of other settings is refused: it would be averaged with these), an interrupted
one resumes. Then the plot (each architecture's train loss, averaged over
seeds, against wall-clock time; test losses dashed; insets of average step time and peak memory)
`OUTPUT_DIR/results.md` (mean ± sample standard deviation over the seeds) and
`OUTPUT_DIR/results.json` (the same statistics, and every run's results) are written.
"""

import dataclasses
import json
import os
import subprocess
import sys
import time

from elita_tf.models import ARCHITECTURES
from elita_tf.renames import accepts_renamed_arguments
from elita_tf.settings_fields import check_field
from elita_tf.training.plot import plot_comparison, read_run, results_table, summarize
from elita_tf.training.run_directory import manifest_differences, read_results, results_json
from elita_tf.training.run_files import RESULTS_FILE
from elita_tf.training.settings import TrainSettings, fields_marked, train_settings

# Settings that change nothing a comparison reports: a finished run trained with others is still the same run.
_NOT_COMPARED = ("force_new", "checkpoint_every", "keep_checkpoints")


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
    summary = os.path.join(output_dir, RESULTS_FILE)
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


def check_plot(path):
    """Raises `ValueError` naming `path` unless matplotlib can write a plot there (a folder is made if missing)."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    extension = os.path.splitext(path)[1][1:].lower()
    if extension and extension not in formats:
        raise ValueError(
            f"matplotlib cannot write a .{extension} plot: give a file ending in one of "
            f"{', '.join('.' + name for name in sorted(formats))}. Received: plot={path}"
        )
    if os.path.isdir(path):
        raise ValueError(f"`plot` is a directory: give the file to write in it, ELiTA.png say. Received: plot={path}")
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):  # the nearest folder that exists holds the ones to make
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ValueError(f"Cannot write the plot: {folder} is not a writable directory. Received: plot={path}")


def check_comparison(output_dir, architectures, seeds, plot=None):
    """Raises `ValueError` for a comparison `compare` would refuse, before anything trains (see `compare`)."""
    unknown = [a for a in architectures if a not in ARCHITECTURES]
    if unknown:
        raise ValueError(
            f"Unknown architectures. Expected names from {sorted(ARCHITECTURES)}. Received: architectures={unknown}"
        )
    # A name twice is one run counted twice (± 0), as a seed twice is.
    if len(set(architectures)) != len(architectures):
        raise ValueError(f"`architectures` must be distinct. Received: architectures={list(architectures)}")
    for seed in seeds:
        check_field(TrainSettings, "seed", seed, shown_as="seeds")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"`seeds` must be distinct non-negative integers. Received: seeds={list(seeds)}")
    if plot is not None:
        check_plot(plot)


def _comparable(settings):
    """A `TrainSettings` as a dict (`dataclasses.asdict`) less what may differ between runs of one comparison."""
    local = fields_marked("local")
    settings = {key: value for key, value in settings.items() if key not in local and key not in _NOT_COMPARED}
    corpus = settings.get("corpus")
    if isinstance(corpus, dict):  # the corpus' local fields: where its files are found
        settings["corpus"] = {key: value for key, value in corpus.items() if key not in ("data_dir", "tfds_dir")}
    return settings


def finished_run_differences(directory, settings):
    """`manifest_differences` between the settings the finished run in `directory` trained with and `settings`.

    `settings` (a `TrainSettings`) is completed as `train` completes it:
    its model fields from its size, its positions from the stored run.
    """
    from elita_tf.training.model_settings import complete_settings, resolve_position_mode  # TensorFlow

    trained = read_results(directory).get("config", {}).get("settings")
    if not isinstance(trained, dict):
        return [f"its {RESULTS_FILE} records no settings (config.settings)"]
    asked = dataclasses.asdict(resolve_position_mode(complete_settings(settings), directory))
    return manifest_differences(_comparable(trained), _comparable(asked))


def _check_finished_runs(output_dir, architectures, seeds, settings):
    """Raises `ValueError` naming a finished run of `output_dir` whose settings are not `settings`."""
    refused = []
    for seed in seeds:
        for name in architectures:
            directory = run_dir(output_dir, name, seed)
            if os.path.exists(os.path.join(directory, RESULTS_FILE)):
                asked = train_settings(output_dir=directory, architecture=name, seed=seed, **settings)
                differences = finished_run_differences(directory, asked)
                if differences:
                    refused.append((directory, differences))
    if refused:
        directory, differences = refused[0]
        others = f" (and {len(refused) - 1} more finished runs)" if len(refused) > 1 else ""
        raise ValueError(
            f"{directory}{others} holds a run finished with other settings, which the table would average with "
            f"these: {'; '.join(differences)}. Give "
            "its settings, another --output-dir, or --force-new to train it again."
        )


@accepts_renamed_arguments
def compare(output_dir, architectures=("elita", "transformer"), seeds=(0,), plot=None, budget_seconds=None, **settings):
    """Trains every architecture with every seed (skipping finished runs), then writes the plot and the tables.

    Args:
        output_dir: str. Runs go to `output_dir/ARCHITECTURE/seed-S`.
        architectures: distinct names from `elita_tf.models.ARCHITECTURES`.
        seeds: distinct ints in `[0, 2**32)`.
        plot: the PNG (or another format of matplotlib's) to write. Defaults to `output_dir/ELiTA.png`.
        budget_seconds: float or None. Seconds from the start: a run that the longest run so far says
            would end past them is skipped, never a model's first seed. The runs go seed by seed
            (every model's first seed, then every model's second), so a budget cuts seeds evenly.
        **settings: other `TrainSettings` and `CorpusSettings` fields (`train_settings`), the same for every run.

    Returns:
        `{architecture: [run_dir, ...]}`.

    Raises:
        ValueError: before any run trains, for a bad argument or a finished run in `output_dir`
            whose settings are not `settings` (unless `force_new`, which trains it again).
    """
    check_comparison(output_dir, architectures, seeds, plot)
    train_settings(output_dir=output_dir, **settings)  # refuse bad settings before the first run
    plot_path = plot or os.path.join(output_dir, "ELiTA.png")
    _check_outputs(output_dir, plot is None and plot_path)
    reuse = not settings.get("force_new")  # --force-new trains every run again
    if reuse:
        _check_finished_runs(output_dir, architectures, seeds, settings)
    os.makedirs(output_dir, exist_ok=True)
    runs = {name: [] for name in architectures}
    start, longest = time.monotonic(), 0.0
    for seed in seeds:
        for name in architectures:
            directory = run_dir(output_dir, name, seed)
            results = os.path.join(directory, RESULTS_FILE)
            if reuse and os.path.exists(results):
                print(f"{name}, seed {seed}: already trained ({results})", flush=True)
            elif budget_seconds is not None and runs[name] and time.monotonic() - start + longest > budget_seconds:
                skipped = f"{name}, seed {seed}: skipped, it would end past the budget of {budget_seconds:.0f} s"
                print(skipped, flush=True)
                continue
            else:
                print(f"{name}, seed {seed}: training", flush=True)
                began = time.monotonic()
                subprocess.run(train_command(output_dir, name, seed, settings), check=True)
                longest = max(longest, time.monotonic() - began)
            runs[name].append(directory)

    os.makedirs(os.path.dirname(os.path.abspath(plot_path)), exist_ok=True)
    plot_comparison(runs, plot_path)
    table = results_table(runs)
    with open(os.path.join(output_dir, "results.md"), "w") as f:
        f.write(table)
    # Each model's statistics over its seeds (those of the table), then every run's own results.
    summary = summarize(runs)
    for name, dirs in runs.items():
        summary[name]["runs"] = {os.path.basename(d): read_run(d)[1] for d in dirs}
    with open(os.path.join(output_dir, RESULTS_FILE), "w") as f:
        f.write(results_json(summary))
    print(table)
    print(f"Plot: {plot_path}")
    return runs
