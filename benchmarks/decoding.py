"""Milliseconds per generated token against context length, from each layer's cache.

For each (preset, context L), a decoder with `context_length = L + 2 * steps` is prefilled with
an L-token prompt and generates tokens greedily (one compiled `tf.while_loop`). The time per
token is `(t(2 * steps) - t(steps)) / steps`: the prefill and the fixed costs cancel.

    python benchmarks/decoding.py --presets elita transformer --contexts 256 1024 4096 16384
"""

import argparse
import os
import platform
import statistics
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["elita", "transformer"])
    parser.add_argument("--contexts", nargs="+", type=int, default=[256, 1024, 4096, 16384])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--vocab-size", type=int, default=5000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    from elita_tf.generation import Generator
    from elita_tf.models import build_decoder, preset

    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, tensorflow {tf.__version__}, keras {keras.__version__}")
    print(f"# B={args.batch_size} vocab={args.vocab_size} d={args.width} L={args.layers}, greedy, {args.steps} steps")
    print("| preset | context | ms / token | prefill + first token ms |")
    print("|---|---|---|---|")
    per_token = {}
    for context in args.contexts:
        for name in args.presets:
            config = preset(
                name,
                vocab_size=args.vocab_size,
                width=args.width,
                num_layers=args.layers,
                context_length=context + 2 * args.steps,
            )
            generator = Generator(build_decoder(config), config)
            prompt = np.random.default_rng(0).integers(0, args.vocab_size, size=(args.batch_size, context))

            def timed(steps):
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    generator(prompt, steps).numpy()
                    times.append(time.perf_counter() - start)
                return statistics.median(times)

            timed(1)  # compile
            short, long = timed(args.steps), timed(2 * args.steps)
            per_token[name, context] = (long - short) / args.steps * 1e3
            print(f"| {name} | {context} | {per_token[name, context]:.2f} | {timed(1) * 1e3:.1f} |", flush=True)
    for name in args.presets:
        rows = [per_token[name, c] for c in args.contexts if (name, c) in per_token]
        print(f"{name}: ms/token at the longest context / shortest = {rows[-1] / rows[0]:.2f}")
    if len(args.presets) == 2:
        a, b = args.presets
        for context in args.contexts:
            print(f"context {context}: {b} / {a} per-token time = {per_token[b, context] / per_token[a, context]:.1f}x")


if __name__ == "__main__":
    main()
