"""The MQAR recall tables and plots (`elita_tf.training.recall`): accuracy against width, and against the bytes
of a sequence's decoding state, one line a design."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _grid(best):
    """`(settings, widths, architectures, {(architecture, T, P, width): record})`, each list in first-seen order."""
    cells = {(r["architecture"], r["sequence_length"], r["num_pairs"], r["width"]): r for r in best}
    settings = list(dict.fromkeys((r["sequence_length"], r["num_pairs"]) for r in best))
    widths = sorted({r["width"] for r in best})
    architectures = list(dict.fromkeys(r["architecture"] for r in best))
    return settings, widths, architectures, cells


def recall_table(best):
    """A markdown table: a row per design, a column per setting and width; accuracy and its best learning rate.

    Args:
        best: the best record of each (architecture, setting, width) (`recall.best_of_sweep`).
    """
    settings, widths, architectures, cells = _grid(best)
    columns = [(t, p, w) for t, p in settings for w in widths]
    header = "| model | " + " | ".join(f"T={t} P={p} d={w}" for t, p, w in columns) + " |"
    lines = [header, "|" + "---|" * (len(columns) + 1)]
    for name in architectures:
        row = []
        for t, p, w in columns:
            record = cells.get((name, t, p, w))
            row.append("" if record is None else f"{record['accuracy']:.3f} (lr {record['learning_rate']:g})")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def state_table(best):
    """A markdown table of each design's decoding state per sequence, in bytes, at each setting and width."""
    settings, widths, architectures, cells = _grid(best)
    columns = [(t, p, w) for t, p in settings for w in widths]
    lines = ["| model | " + " | ".join(f"T={t} P={p} d={w}" for t, p, w in columns) + " |"]
    lines.append("|" + "---|" * (len(columns) + 1))
    for name in architectures:
        row = [f"{cells[(name, t, p, w)]['state_bytes']:,}" if (name, t, p, w) in cells else "" for t, p, w in columns]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot_frontier(best, path):
    """Based's frontier: a panel per setting, MQAR accuracy against the bytes of a sequence's decoding state
    (log scale), a line per design through its widths."""
    settings, widths, architectures, cells = _grid(best)
    fig, axes = plt.subplots(1, len(settings), figsize=(3.6 * len(settings), 3.8), dpi=120, squeeze=False)
    for ax, (t, p) in zip(axes[0], settings):
        ax.axhline(1 / p, color="0.5", linestyle=":", linewidth=1, label="chance, 1 / pairs")
        for name in architectures:
            points = [cells[(name, t, p, w)] for w in widths if (name, t, p, w) in cells]
            ax.plot([r["state_bytes"] for r in points], [r["accuracy"] for r in points], marker="o", label=name)
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"Sequence length {t}, {p} pairs", fontsize=9)
        ax.set_xlabel("Decoding state per sequence (bytes)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy")
    axes[0][0].legend(fontsize=6, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_recall(best, path):
    """Zoology's figure 2: a panel per setting, MQAR accuracy against model width, a line per design.

    Args:
        best: the best record of each (architecture, setting, width).
        path: the PNG to write.
    """
    settings, widths, architectures, cells = _grid(best)
    # The legend below the panels, as Zoology's: inside, it hides the lines at chance.
    columns = min(4, 2 * len(settings))
    legend_height = 0.17 * -(-(len(architectures) + 1) // columns) + 0.1  # inches: a row per `columns` entries
    fig, axes = plt.subplots(
        1, len(settings), figsize=(3.6 * len(settings), 3.4 + legend_height), dpi=120, squeeze=False
    )
    for ax, (t, p) in zip(axes[0], settings):
        ax.axhline(1 / p, color="0.5", linestyle=":", linewidth=1, label="chance, 1 / pairs")
        for name in architectures:
            points = [(w, cells[(name, t, p, w)]["accuracy"]) for w in widths if (name, t, p, w) in cells]
            ax.plot([w for w, _ in points], [a for _, a in points], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"Sequence length {t}, {p} pairs", fontsize=9)
        ax.set_xlabel("Model dimension")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, legend_height / (3.4 + legend_height), 1, 1))
    fig.savefig(path)
    plt.close(fig)
