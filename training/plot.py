"""The comparison plot in the style of the ELiTA reference (`ELiTA.png`) and the results table."""

import csv
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_run(run_dir):
    """`(steps, results)`: the rows of `steps.csv` as floats and `results.json`."""
    with open(os.path.join(run_dir, "steps.csv")) as f:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    with open(os.path.join(run_dir, "results.json")) as f:
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


def plot_comparison(runs, path, title="WikiText-2"):
    """Train loss against wall-clock time per model, test losses dashed, insets of step time and memory.

    Args:
        runs: `{label: run_dir}`.
        path: the PNG to write.
    """
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    summary = {}
    for colour, (label, run_dir) in zip(colours, runs.items()):
        rows, results = read_run(run_dir)
        # Training time: the steps' own time, validation passes left out.
        times, total = [], 0.0
        for r in rows:
            total += r["step_time_s"]
            times.append(total)
        losses = _smooth([r["loss"] for r in rows], max(1, len(rows) // 50))
        ax.plot(times, losses, color=colour, label=f"{label} (train)")
        ax.axhline(
            results["test_loss"],
            color=colour,
            linestyle="--",
            linewidth=1,
            label=f"{label} test {results['test_loss']:.3f}",
        )
        summary[label] = (results.get("step_time_s", float("nan")), results["peak_memory_mib"] / 1024, colour)
    ax.set_xlabel("Training time (s)")
    ax.set_ylabel("Loss (nats/token)")
    ax.set_title(f"{title}: train loss against wall-clock time, test loss dashed")
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3)

    labels = list(summary)
    for position, (index, name, unit) in zip([0.56, 0.8], [(0, "Avg step time", "s"), (1, "Peak RAM", "GB")]):
        inset = ax.inset_axes([position, 0.58, 0.17, 0.3])
        values = [summary[k][index] for k in labels]
        inset.bar(range(len(labels)), values, color=[summary[k][2] for k in labels])
        inset.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=6)
        inset.set_title(f"{name} ({unit})", fontsize=8)
        inset.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def results_table(runs):
    """A markdown table of the runs' results."""
    lines = [
        "| model | params | test loss | test perplexity | validation loss | step time (s) | tokens/s | peak memory (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, run_dir in runs.items():
        _, r = read_run(run_dir)
        lines.append(
            f"| {label} | {r['params']:,} | {r['test_loss']:.4f} | {r['test_perplexity']:.1f} | "
            f"{r['validation_loss']:.4f} | {r.get('step_time_s', float('nan')):.3f} | "
            f"{r.get('tokens_per_s', float('nan')):,.0f} | {r['peak_memory_mib']:,.0f} |"
        )
    return "\n".join(lines) + "\n"
