"""Training-step time and peak memory of decoder presets against T, at a constant number of tokens a batch.

Each (preset, T) runs in its own process: a compiled `train_step` (Adam, the ELiTA schedule,
cross-entropy) on random token ids, median of `--repeats` steps after the first (compile)
one, and the peak resident set size above the process's baseline (on a GPU, the peak
memory TensorFlow held there). The tensor peak is the most memory TensorFlow's allocator held
for the timed steps' tensors: the model's own memory, without the process's libraries, traced
graphs and caches.

    python benchmarks/training_step.py --presets elita transformer --seq-lens 256 1024 4096
"""

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

from measure import device_description, run_measurement, use_gpu_peak


def run_one(args):
    import keras
    import numpy as np
    import tensorflow as tf

    from elita_tf.models import build_decoder, preset
    from elita_tf.schedules import elita_adam

    with open("/proc/self/statm") as f:
        base = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    batch = max(1, args.tokens // args.seq_len)
    keras.config.set_dtype_policy(args.dtype_policy)
    config = preset(
        args.preset,
        vocab_size=args.vocab_size,
        width=args.width,
        num_layers=args.layers,
        num_heads=args.heads,
        head_dim=args.head_dim,
        context_length=args.seq_len,
    )
    model = build_decoder(config)
    model.compile(
        elita_adam(), keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=args.jit_compile
    )
    model.chunked_head = args.output_head == "chunked"
    rng = np.random.default_rng(0)
    x = tf.constant(rng.integers(0, args.vocab_size, size=(batch, args.seq_len)), tf.int32)
    y = tf.constant(rng.integers(0, args.vocab_size, size=(batch, args.seq_len)), tf.int32)
    device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    times = []
    for step in range(args.repeats + 1):
        start = time.perf_counter()
        loss = float(model.train_on_batch(x, y))
        times.append(time.perf_counter() - start)
        if step == 0:  # from here on, the allocator's peak is the steps' own tensors
            tf.config.experimental.reset_memory_stats(device)
    result = {
        "preset": args.preset,
        "output_head": args.output_head,
        "jit_compile": args.jit_compile,
        "dtype_policy": args.dtype_policy,
        "T": args.seq_len,
        "B": batch,
        "params": model.count_params(),
        "compile_s": times[0],
        "step_s": statistics.median(times[1:]),
        "loss": loss,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base,
        # The most memory the steps' tensors held at once, without the process's libraries, graphs and caches.
        "tensor_peak_mib": tf.config.experimental.get_memory_info(device)["peak"] / 2**20,
    }
    print(json.dumps(use_gpu_peak(result)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["elita", "transformer"])
    parser.add_argument("--seq-lens", nargs="+", type=int, default=[256, 1024, 4096])
    parser.add_argument("--tokens", type=int, default=32768, help="tokens a batch: B = tokens // T")
    parser.add_argument("--vocab-size", type=int, default=5000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--output-heads",
        nargs="+",
        choices=["chunked", "full"],
        default=["chunked"],
        help="the loss a chunk of tokens at a time (elita-train's), or from the full [B, T, V] logits (Keras')",
    )
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--jit-compile", action="store_true", help="compile the training step with XLA")
    parser.add_argument("--dtype-policy", default="float32", help="e.g. mixed_bfloat16")
    parser.add_argument("--preset", help=argparse.SUPPRESS)
    parser.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--output-head", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.preset:
        return run_one(args)

    import keras
    import tensorflow as tf

    print(
        f"# {platform.machine()}, {os.cpu_count()} CPUs, {device_description()}, "
        f"tensorflow {tf.__version__}, keras {keras.__version__}"
    )
    print(
        f"# tokens/batch={args.tokens} vocab={args.vocab_size} d={args.width} L={args.layers} H={args.heads} "
        f"jit_compile={args.jit_compile} dtype_policy={args.dtype_policy}"
    )
    print("| preset | output head | T | B | params | step s | tokens/s | peak MiB | tensor peak MiB | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = {}
    for length in args.seq_lens:
        for head in args.output_heads:
            for name in args.presets:
                cmd = [sys.executable, __file__, "--preset", name, "--seq-len", str(length), "--output-head", head]
                for flag in ["tokens", "vocab_size", "width", "layers", "heads", "head_dim", "repeats"]:
                    cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
                cmd += ["--dtype-policy", args.dtype_policy] + (["--jit-compile"] if args.jit_compile else [])
                r, reason = run_measurement(cmd, args.timeout)
                if r is None:
                    print(f"| {name} | {head} | {length} | | {reason} | | | | | |", flush=True)
                    continue
                results[name, head, length] = r
                print(
                    f"| {name} | {head} | {length} | {r['B']} | {r['params']:,} | {r['step_s']:.3g} | "
                    f"{r['B'] * length / r['step_s']:,.0f} | {r['peak_mib']:,.0f} | {r['tensor_peak_mib']:,.0f} | "
                    f"{r['compile_s']:.1f} |",
                    flush=True,
                )
    base = args.presets[-1]
    for (name, head, length), r in sorted(results.items(), key=lambda kv: kv[0][2]):
        if name != base and (base, head, length) in results:
            other = results[base, head, length]
            print(
                f"T={length}, {head} head: {name} / {base}: step time {r['step_s'] / other['step_s']:.2f}x, "
                f"peak memory {r['peak_mib'] / other['peak_mib']:.2f}x, "
                f"tensor peak {r['tensor_peak_mib'] / other['tensor_peak_mib']:.2f}x"
            )


if __name__ == "__main__":
    main()
