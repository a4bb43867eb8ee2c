"""Draw `docs/long_context.png` and print docs/long-context.md's tables from `training/long_context.sh`'s runs.

    python training/plot_long_context.py runs/long_context --output docs/long_context.png

Left: the test loss in log-spaced position buckets, each run scored in sequences of up to 16K tokens
(its training length dotted). Right: ELiTA's position terms `P1` (added to the keys' logits) and
`P2` (added to the queries' gate logit) of every layer and head, from position 0 to 16K, for each
ELiTA run: flat lines past the training length would mean the terms stay in the range trained.
"""

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from elita_tf.layers import Attention2  # noqa: E402
from elita_tf.models import ElitaCausalLM  # noqa: E402
from elita_tf.training.run_directory import read_manifest  # noqa: E402
from elita_tf.training.run_files import preset_of  # noqa: E402

POSITIONS = 16384


def _load(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def position_terms(run_dir, length=POSITIONS):
    """`P1, P2 [layers, heads, length]` of every Attention2 layer of a run, at positions `0 .. length - 1`."""
    backbone = ElitaCausalLM.from_preset(preset_of(run_dir)).backbone
    terms = []
    for layer in backbone._flatten_layers():
        if isinstance(layer, Attention2):
            index = tf.range(length)[None]
            p1, p2 = layer._position_terms(layer._positions(index, length))
            terms.append((p1[0].numpy(), p2[0].numpy()))
    return np.stack([t[0] for t in terms]), np.stack([t[1] for t in terms])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", help="the output directory of training/long_context.sh")
    parser.add_argument("--output", default="docs/long_context.png")
    args = parser.parse_args()

    runs = sorted(name for name in os.listdir(args.runs) if read_manifest(os.path.join(args.runs, name)))
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    print("| run | trained T | test loss by position (sequences of up to 16K) | test split as one stream |")
    print("|---|---|---|---|")
    for color, name in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], runs):
        run_dir = os.path.join(args.runs, name)
        sequence_length = read_manifest(run_dir)["training"]["sequence_length"]
        left.axvline(sequence_length, color=color, linestyle=":", linewidth=1)
        for file, stream_file, label, style in (
            ("test-sequences.json", "test-stream.json", name, "o-"),
            ("test-sequences-clamped.json", "test-stream-clamped.json", f"{name}, clamped positions", "s--"),
        ):
            sequences = _load(os.path.join(run_dir, file))
            if sequences is None:
                continue
            buckets = sequences["loss_by_position"]
            middles = [np.sqrt(max(b["start"], 1) * b["end"]) for b in buckets]
            left.plot(middles, [b["loss"] for b in buckets], style, color=color, label=label)
            cells = ", ".join(f"{b['start']}-{b['end']}: {b['loss']:.3f}" for b in buckets)
            stream = _load(os.path.join(run_dir, stream_file))
            whole = f"{stream['loss']:.3f}" if stream else "-"
            print(f"| {label} | {sequence_length} | {cells} | {whole} |")
        if name.startswith("elita"):
            p1, p2 = position_terms(run_dir)
            for terms, style in ((p1, "-"), (p2, "--")):
                inside, past = terms[..., :sequence_length], terms[..., sequence_length:]
                # A run trained at 16K has no position past T in the range drawn.
                beyond = f"past T [{past.min():.2f}, {past.max():.2f}]" if past.size else "nothing past T"
                print(
                    f"    {'P1' if style == '-' else 'P2'}: range inside T [{inside.min():.2f}, {inside.max():.2f}], "
                    f"{beyond} (over layers and heads)"
                )
            spread = p1.reshape(-1, POSITIONS)
            right.plot(np.arange(1, POSITIONS + 1), spread.T, color=color, linewidth=0.6, alpha=0.5)
            right.axvline(sequence_length, color=color, linestyle=":", linewidth=1)
    left.set(xscale="log", xlabel="position in the sequence", ylabel="test loss", title="Loss by position")
    left.legend()
    right.set(xscale="log", xlabel="position", ylabel="P1 (every layer and head)", title="ELiTA's key position terms")
    figure.tight_layout()
    figure.savefig(args.output, dpi=120)
    print(f"Wrote {args.output}")


if __name__ == "__main__":
    main()
