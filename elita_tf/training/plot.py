"""The comparison plot in the style of the ELiTA reference (`ELiTA.png`) and the results table."""

import csv
import json
import math
import os
import statistics

import matplotlib

from elita_tf.training.run_files import RESULTS_FILE, STEPS_FILE

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_run(run_dir):
    """`(steps, results)`: the rows of `steps.csv` as floats and `results.json`."""
    with open(os.path.join(run_dir, STEPS_FILE)) as f:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    with open(os.path.join(run_dir, RESULTS_FILE)) as f:
        results = json.load(f)
    return rows, results


def _smooth(values, width):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= width:
            total -= values[i - width]
        out.append(total / min(i + 1, width))
    return out


def _as_list(run_dirs):
    return [run_dirs] if isinstance(run_dirs, (str, os.PathLike)) else list(run_dirs)


def _mean_sd(values):
    values = [v for v in values if v is not None and v == v]  # None, NaN: a figure the run did not record
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def plot_comparison(runs, path, title="WikiText-2"):
    """Train loss against wall-clock time per model, test losses dashed, insets of step time and memory.

    Args:
        runs: `{label: run_dir}` or `{label: [run_dir, ...]}`, one run a seed: the curve is the
            mean over seeds of each step's loss against the mean elapsed time, the dashed line and
            the insets the means.
        path: the PNG to write.
    """
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    summary = {}
    reads = {label: [read_run(d) for d in _as_list(run_dirs)] for label, run_dirs in runs.items()}
    # On a GPU its own peak memory; elsewhere the process's. One kind for every bar of the inset.
    on_gpu = all("peak_gpu_memory_mib" in r for read in reads.values() for _, r in read)
    memory_key, memory_name = ("peak_gpu_memory_mib", "Peak GPU memory") if on_gpu else ("peak_memory_mib", "Peak RAM")
    for colour, (label, read) in zip(colours, reads.items()):
        steps = min(len(rows) for rows, _ in read)
        # Training time: the steps' own time, validation passes left out.
        times, total = [], 0.0
        for k in range(steps):
            total += statistics.fmean(rows[k]["step_time_s"] for rows, _ in read)
            times.append(total)
        losses = _smooth(
            [statistics.fmean(rows[k]["loss"] for rows, _ in read) for k in range(steps)], max(1, steps // 50)
        )
        seeds = f", {len(read)} seeds" if len(read) > 1 else ""
        ax.plot(times, losses, color=colour, label=f"{label} (train{seeds})")
        test, test_sd = _mean_sd([r["test_loss"] for _, r in read])
        spread = f" ± {test_sd:.3f}" if len(read) > 1 else ""
        ax.axhline(test, color=colour, linestyle="--", linewidth=1, label=f"{label} test {test:.3f}{spread}")
        step_time = _mean_sd([r.get("step_time_s", float("nan")) for _, r in read])[0]
        memory = _mean_sd([r[memory_key] for _, r in read])[0] / 1024
        summary[label] = (step_time, memory, colour)
    ax.set_xlabel("Training time (s)")
    ax.set_ylabel("Loss (nats/token)")
    ax.set_title(f"{title}: train loss against wall-clock time, test loss dashed")
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3)

    labels = list(summary)
    for position, (index, name, unit) in zip([0.56, 0.8], [(0, "Avg step time", "s"), (1, memory_name, "GB")]):
        inset = ax.inset_axes([position, 0.58, 0.17, 0.3])
        values = [summary[k][index] for k in labels]
        inset.bar(range(len(labels)), values, color=[summary[k][2] for k in labels])
        inset.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=6)
        inset.set_title(f"{name} ({unit})", fontsize=8)
        inset.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


METRICS = (
    "test_loss",
    "test_perplexity",
    "validation_loss",
    "step_time_s",
    "tokens_per_s",
    "peak_memory_mib",
    "peak_gpu_memory_mib",
)


def summarize(runs):
    """Each model's seeds, parameters, and mean and sample standard deviation of every metric over its seeds.

    Args:
        runs: `{label: run_dir}` or `{label: [run_dir, ...]}`.

    Returns:
        `{label: {"seeds", "params", "params_without_embeddings", "mean": {metric: x}, "sd": {metric: x}}}`;
        the standard deviation is the sample one (n - 1), 0.0 for a single seed.
    """
    summary = {}
    for label, run_dirs in runs.items():
        results = [read_run(d)[1] for d in _as_list(run_dirs)]
        stats = {metric: _mean_sd([r.get(metric, float("nan")) for r in results]) for metric in METRICS}
        summary[label] = {
            "seeds": [r.get("seed") for r in results],
            "params": results[0]["params"],
            "params_without_embeddings": results[0].get("params_without_embeddings"),
            "mean": {metric: mean for metric, (mean, _) in stats.items()},
            "sd": {metric: sd for metric, (_, sd) in stats.items()},
        }
    return summary


# The line under a table with a step time of n/a (`StepLog` times the steps).
UNTIMED = (
    "n/a: not recorded. The step time leaves out the first step of each epoch, which traces the model: a run "
    "of one step an epoch has none."
)


def _cell(entry, metric, fmt):
    mean, sd = entry["mean"][metric], entry["sd"][metric]
    if math.isnan(mean):
        return "n/a"
    return f"{mean:{fmt}}" + (f" ± {sd:{fmt}}" if len(entry["seeds"]) > 1 else "")


def results_table(runs):
    """A markdown table of the runs' results: mean ± sample standard deviation over each model's seeds.

    A figure no run of a model recorded is "n/a"; a step time, with a line
    under the table that says why (`UNTIMED`).

    Args:
        runs: `{label: run_dir}` or `{label: [run_dir, ...]}`.
    """
    formats = [("test_loss", ".4f"), ("test_perplexity", ".1f"), ("validation_loss", ".4f")]
    formats += [("step_time_s", ".3f"), ("tokens_per_s", ",.0f"), ("peak_memory_mib", ",.0f")]
    header = "| model | seeds | params | params without embeddings | test loss | test perplexity | validation loss "
    header += "| step time (s) | tokens/s | peak memory (MiB) |"
    summary = summarize(runs)
    if any(not math.isnan(entry["mean"]["peak_gpu_memory_mib"]) for entry in summary.values()):
        formats.append(("peak_gpu_memory_mib", ",.0f"))  # runs on a GPU: its peak too
        header += " peak GPU memory (MiB) |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for label, entry in summary.items():
        cells = [_cell(entry, metric, fmt) for metric, fmt in formats]
        seeds = ", ".join(str(seed) for seed in entry["seeds"])
        without = entry["params_without_embeddings"]
        lines.append(
            f"| {label} | {seeds} | {entry['params']:,} | {'' if without is None else f'{without:,}'} | "
            + " | ".join(cells)
            + " |"
        )
    untimed = any(math.isnan(entry["mean"]["step_time_s"]) for entry in summary.values())
    return "\n".join(lines) + "\n" + (f"\n{UNTIMED}\n" if untimed else "")
