"""`elita-compare`: train several presets on the same data and token budget, then plot and tabulate.

    elita-compare --presets elita transformer --data-dir ../shared/data/wikitext-2 \\
        --output-dir runs/compare --epochs 3 --plot ELiTA.png

Each preset trains in its own process (`elita-train`, so its peak memory is its own) under
`OUTPUT_DIR/PRESET`; a finished preset is not trained again, an interrupted one resumes. Then
the plot (train loss against wall-clock time, test losses dashed, insets of average step time
and peak memory) and `OUTPUT_DIR/results.md` are written.
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
    "seed": int,
    "checkpoint_every": int,
    "eval_batches": int,
    "verbose": int,
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="elita-compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["elita", "transformer"])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--plot", help="PNG to write (default: OUTPUT_DIR/ELiTA.png)")
    for name, kind in TRAIN_ARGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind)
    args = parser.parse_args(argv)
    unknown = [p for p in args.presets if p not in PRESETS]
    if unknown:
        parser.error(f"unknown presets {unknown}; choose from {sorted(PRESETS)}")
    return args


def train_command(args, preset):
    command = [sys.executable, "-m", "training.train", "--preset", preset]
    command += ["--output-dir", os.path.join(args.output_dir, preset)]
    for name in TRAIN_ARGS:
        value = getattr(args, name)
        if value is not None:
            command += [f"--{name.replace('_', '-')}", str(value)]
    return command


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    runs = {}
    for preset in args.presets:
        run_dir = os.path.join(args.output_dir, preset)
        results = os.path.join(run_dir, "results.json")
        if os.path.exists(results):
            print(f"{preset}: already trained ({results})", flush=True)
        else:
            print(f"{preset}: training", flush=True)
            subprocess.run(train_command(args, preset), check=True)
        runs[preset] = run_dir

    plot_path = args.plot or os.path.join(args.output_dir, "ELiTA.png")
    plot_comparison(runs, plot_path)
    table = results_table(runs)
    with open(os.path.join(args.output_dir, "results.md"), "w") as f:
        f.write(table)
    summary = {preset: json.load(open(os.path.join(d, "results.json"))) for preset, d in runs.items()}
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(table)
    print(f"Plot: {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
