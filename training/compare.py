"""`elita-compare`: train several presets on the same data and token budget, then plot and tabulate.

    elita-compare --presets elita transformer --seeds 0 1 2 --output-dir runs/compare --epochs 2 --plot ELiTA.png

Each preset and seed trains in its own process (`elita-train`, so its peak memory is its own),
one after the other, under `OUTPUT_DIR/PRESET/seed-S`; a finished run is not trained again, an
interrupted one resumes. Then the plot (each preset's train loss, averaged over seeds, against
wall-clock time; test losses dashed; insets of average step time and peak memory) and
`OUTPUT_DIR/results.md` (mean ± standard deviation over the seeds) are written.
"""

import argparse
import json
import os
import subprocess
import sys

from elita_tf.models import PRESETS
from training.plot import plot_comparison, results_table

# Arguments passed through to every elita-train run, with their types.
TRAIN_ARGS = {
    "data_dir": str,
    "dataset": str,
    "tfds_dir": str,
    "vocab_size": int,
    "seq_len": int,
    "batch_size": int,
    "epochs": int,
    "max_steps": int,
    "width": int,
    "layers": int,
    "heads": int,
    "head_dim": int,
    "dropout": float,
    "checkpoint_every": int,
    "eval_batches": int,
    "verbose": int,
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="elita-compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["elita", "transformer"])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--plot", help="PNG to write (default: OUTPUT_DIR/ELiTA.png)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="train every preset with each seed")
    for name, kind in TRAIN_ARGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind)
    args = parser.parse_args(argv)
    unknown = [p for p in args.presets if p not in PRESETS]
    if unknown:
        parser.error(f"unknown presets {unknown}; choose from {sorted(PRESETS)}")
    if any(seed < 0 for seed in args.seeds) or len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds must be distinct non-negative integers, got {args.seeds}")
    return args


def run_dir(args, preset, seed):
    return os.path.join(args.output_dir, preset, f"seed-{seed}")


def train_command(args, preset, seed):
    command = [sys.executable, "-m", "training.train", "--preset", preset, "--seed", str(seed)]
    command += ["--output-dir", run_dir(args, preset, seed)]
    for name in TRAIN_ARGS:
        value = getattr(args, name)
        if value is not None:
            command += [f"--{name.replace('_', '-')}", str(value)]
    return command


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    runs = {preset: [] for preset in args.presets}
    for preset in args.presets:
        for seed in args.seeds:
            directory = run_dir(args, preset, seed)
            results = os.path.join(directory, "results.json")
            if os.path.exists(results):
                print(f"{preset}, seed {seed}: already trained ({results})", flush=True)
            else:
                print(f"{preset}, seed {seed}: training", flush=True)
                subprocess.run(train_command(args, preset, seed), check=True)
            runs[preset].append(directory)

    plot_path = args.plot or os.path.join(args.output_dir, "ELiTA.png")
    plot_comparison(runs, plot_path)
    table = results_table(runs)
    with open(os.path.join(args.output_dir, "results.md"), "w") as f:
        f.write(table)
    summary = {
        preset: {os.path.basename(d): json.load(open(os.path.join(d, "results.json"))) for d in dirs}
        for preset, dirs in runs.items()
    }
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(table)
    print(f"Plot: {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
