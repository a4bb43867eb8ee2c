"""Forward and forward+backward cost of the attention layers against T, with baselines.

Each (subject, T) runs in its own process, so its peak memory is its own:
the peak resident set size above what the process held before building
the inputs (on a GPU, the peak memory TensorFlow held there). Batches hold
a constant number of tokens (`--tokens`), so a linear-time layer shows a
flat time per token.

Subjects:
  kernel          elita_tf.ops.causal_softmax_mean on [B, H, T] logits, [B, H, T, D] values (its form chosen by where
                  it runs: direct under XLA or on a GPU); kernel-factored and kernel-direct force a form
  elementwise     one elementwise pass over the same values tensor (the memory-bound floor)
  attention2      Attention2 at width d
  linear          LinearAttention
  additive        AdditiveAttention, global; additive-w4 / additive-w1000 / additive-w1024 windowed
  trilinear       TriLinearAttention, narrow (window 64; qdim d/2, tt d/4)
  shaped          ShapedAttention (softmax attention, quadratic)
  mha             keras.layers.MultiHeadAttention(use_causal_mask=True), same heads and head width
  feedforward2    FeedForward2 at width d (position-wise: its cost beside the mixers')

    python benchmarks/layers.py                       # the README table
    python benchmarks/layers.py --subjects kernel elementwise --sequence-lengths 16384
    python benchmarks/layers.py --xla --dtype-policy mixed_bfloat16 --subjects kernel attention2 \
        --sequence-lengths 8192 --tokens 16384 --heads 8 --head-dim 64 --width 512     # the 25M size's shapes
    python benchmarks/layers.py --backends tensorflow jax torch --subjects kernel attention2   # every backend

Each measurement runs on one Keras backend (`--backends`, TensorFlow by default), in its own process;
on JAX every function is `jax.jit`ted, on PyTorch it runs eagerly (`--xla`: `torch.compile`).

Under a mixed policy the layers compute in its compute dtype, and the kernel takes its values in it (its logits
stay float32, as `Attention2` passes them).
"""

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

from measure import (
    describe_environment,
    environment,
    kernel_inputs,
    loss_functions,
    rss_mib,
    run_measurement,
    time_left,
    use_gpu_peak,
    wait_for,
)

SUBJECTS = ["kernel", "elementwise", "attention2", "mha"]
# The kernel in the form it takes where it runs, and in each form (`causal_softmax_mean(form=...)`).
KERNELS = {"kernel": None, "kernel-factored": "factored", "kernel-direct": "direct"}
LAYERS = [
    "attention2",
    "linear",
    "additive",
    "additive-w4",
    "additive-w1000",
    "additive-w1024",
    "trilinear",
    "shaped",
    "mha",
]
POSITION_WISE = ["feedforward2"]  # not compared with MultiHeadAttention
QUADRATIC = ["mha", "shaped"]


def make_layer(subject, args):
    """The layer a subject names, at the benchmark's heads, head width and width."""
    import keras

    from elita_tf import layers

    h, d, c, dtype = args.heads, args.head_dim, args.chunk_size, args.dtype_policy
    if subject == "attention2":
        return layers.Attention2(h, d, position_dim=16, chunk_size=c, dtype=dtype)
    if subject == "linear":
        return layers.LinearAttention(h, d, dtype=dtype)
    if subject.startswith("additive"):
        window = int(subject.split("-w")[1]) if "-w" in subject else None
        return layers.AdditiveAttention(h, sliding_window_size=window, chunk_size=c, dtype=dtype)
    if subject == "trilinear":
        return layers.TriLinearAttention(
            query_dim=args.width // 2, lowrank_dim=args.width // 4, sliding_window_size=64, dtype=dtype
        )
    if subject == "shaped":
        return layers.ShapedAttention(h, max_sequence_length=1, dtype=dtype)
    if subject == "feedforward2":
        return layers.FeedForward2(dtype=dtype)
    return keras.layers.MultiHeadAttention(h, d, dtype=dtype)


def _peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(args):
    """Runs one (subject, T) in this process and prints one JSON line."""
    import keras
    from keras import ops

    length, batch = args.sequence_length, max(1, args.tokens // args.sequence_length)
    heads, depth, width = args.heads, args.head_dim, args.width
    base = rss_mib()
    if args.subject in KERNELS or args.subject == "elementwise":
        logits, values = kernel_inputs(batch, heads, length, depth)
        inputs = [logits, ops.cast(values, keras.DTypePolicy(args.dtype_policy).compute_dtype)]
        if args.subject in KERNELS:
            from elita_tf.ops import causal_softmax_mean

            form = KERNELS[args.subject]
            forward = lambda l, v: causal_softmax_mean(l, v, chunk_size=args.chunk_size, form=form)[0]  # noqa: E731
        else:
            forward = lambda l, v: v * 2.0  # noqa: E731
        weights = []
    else:
        x = keras.random.normal([batch, length, width], seed=0)
        inputs = [x]
        layer = make_layer(args.subject, args)
        forward = layer
        if args.subject == "mha":
            forward = lambda x: layer(x, x, use_causal_mask=True)  # noqa: E731
        forward(x[:, :2])  # build
        weights = layer.trainable_weights

    # A dense gradient into the backward pass, as inside a model (`loss_functions`): shaped like the outputs,
    # which are shaped like the last input (the values, or the layer's inputs).
    cotangent = ops.cast(keras.random.normal(ops.shape(inputs[-1]), seed=1), "float32")
    fwd, fwd_bwd = loss_functions(forward, weights, jit_compile=args.xla, cotangent=cotangent)

    def timed(fn):
        start = time.perf_counter()
        out = fn(*inputs)
        wait_for(out)
        return time.perf_counter() - start, out

    result = {"subject": args.subject, "backend": keras.backend.backend(), "T": length, "B": batch, "H": heads, "D": depth, "d": width}
    result.update(dtype_policy=args.dtype_policy, xla=args.xla)
    for name, fn in [("fwd", fwd), ("fwd_bwd", fwd_bwd)]:
        compile_s, out = timed(fn)
        finite = all(bool(ops.all(ops.isfinite(t))) for t in keras.tree.flatten(out) if t is not None)
        times = [timed(fn)[0] for _ in range(args.repeats)]
        median = statistics.median(times)
        result.update(
            {
                f"{name}_compile_s": compile_s,
                f"{name}_ms": median * 1e3,
                f"{name}_tokens_per_s": batch * length / median,
                f"{name}_finite": finite,
            }
        )
    result["peak_mib"] = _peak_rss_mib() - base
    result.update(environment())
    print(json.dumps(use_gpu_peak(result)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    subjects = [*KERNELS, "elementwise"] + LAYERS + POSITION_WISE
    parser.add_argument("--subjects", nargs="+", default=SUBJECTS, choices=subjects)
    parser.add_argument("--sequence-lengths", nargs="+", type=int, default=[256, 1024, 4096, 16384, 65536])
    parser.add_argument("--tokens", type=int, default=65536, help="tokens per batch: B = tokens // T")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--chunk-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--backends",
        nargs="+",
        default=["tensorflow"],
        choices=["tensorflow", "jax", "torch"],
        help="the Keras backends to measure, each (subject, T) on each; ratios are to TensorFlow's",
    )
    parser.add_argument(
        "--xla", action="store_true", help="compile: XLA on TensorFlow, torch.compile on PyTorch (JAX always jits)"
    )
    parser.add_argument("--dtype-policy", default="float32", help="the layers' Keras dtype policy, e.g. mixed_bfloat16")
    parser.add_argument(
        "--quadratic-max-len", type=int, default=4096, help="longest T for the softmax layers (T^2 memory)"
    )
    parser.add_argument("--timeout", type=int, default=900, help="seconds per measurement")
    parser.add_argument("--out", help="also append the JSON lines to this file")
    parser.add_argument(
        "--deadline", type=float, help="a Unix time: every measurement ends by it, none starts in the minute before it"
    )
    parser.add_argument("--subject", help=argparse.SUPPRESS)
    parser.add_argument("--sequence-length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.subject:
        return run_one(args)

    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    print(f"# backends={' '.join(args.backends)} xla={args.xla} dtype_policy={args.dtype_policy}")
    print(f"# tokens/batch={args.tokens} H={args.heads} D={args.head_dim} d={args.width} C={args.chunk_size}")
    header = "| backend | subject | T | B | fwd ms | fwd+bwd ms | fwd+bwd tokens/s | peak MiB | compile s | finite |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    results = []
    for length in args.sequence_lengths:
        for subject in args.subjects:
            if subject in QUADRATIC and length > args.quadratic_max_len:
                continue
            for backend in args.backends:
                r = _measure(args, subject, length, backend)
                if r is not None:
                    results.append(r)
    if results:
        print(describe_environment(results[0]))
    _print_ratios(results)


def _measure(args, subject, length, backend):
    """One (subject, T) on one backend, in a process of its own: its row printed, its result returned (or None)."""
    cmd = [sys.executable, __file__, "--subject", subject, "--sequence-length", str(length)]
    for flag in ["tokens", "heads", "head_dim", "width", "chunk_size", "repeats"]:
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    cmd += ["--dtype-policy", args.dtype_policy] + (["--xla"] if args.xla else [])
    timeout = time_left(args.deadline, args.timeout)
    if timeout is None:
        print(f"| {backend} | {subject} | {length} | | skipped: past the deadline | | | | | |", flush=True)
        return None
    os.environ["KERAS_BACKEND"] = backend  # the child's backend; this process imports none
    r, reason = run_measurement(cmd, timeout)
    if r is None:
        print(f"| {backend} | {subject} | {length} | | {reason} | | | | | |", flush=True)
        return None
    print(
        f"| {backend} | {subject} | {r['T']} | {r['B']} | {r['fwd_ms']:.1f} | {r['fwd_bwd_ms']:.1f} | "
        f"{r['fwd_bwd_tokens_per_s']:,.0f} | {r['peak_mib']:.0f} | "
        f"{r['fwd_compile_s'] + r['fwd_bwd_compile_s']:.1f} | {r['fwd_finite'] and r['fwd_bwd_finite']} |",
        flush=True,
    )
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(r) + "\n")
    return r


def _print_ratios(results):
    """Ratios against baselines measured in the same run: within each backend, and each backend against TensorFlow."""
    by = {(r.get("backend", "tensorflow"), r["subject"], r["T"]): r for r in results}
    per_token = lambda r, k: r[f"{k}_ms"] / (r["B"] * r["T"])  # noqa: E731
    print()
    for (backend, subject, length), r in sorted(by.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
        if subject == "kernel" and (backend, "elementwise", length) in by:
            ratio = r["fwd_ms"] / by[backend, "elementwise", length]["fwd_ms"]
            print(f"{backend}, T={length}: kernel forward = {ratio:.1f}x one elementwise pass")
        if subject in LAYERS and subject != "mha" and (backend, "mha", length) in by:
            mha = by[backend, "mha", length]
            print(
                f"{backend}, T={length}: MultiHeadAttention / {subject} time per token: "
                f"forward {per_token(mha, 'fwd') / per_token(r, 'fwd'):.1f}x, "
                f"forward+backward {per_token(mha, 'fwd_bwd') / per_token(r, 'fwd_bwd'):.1f}x"
            )
        if backend != "tensorflow" and ("tensorflow", subject, length) in by:
            tf_row = by["tensorflow", subject, length]
            print(
                f"{backend} / tensorflow, {subject}, T={length}: forward {r['fwd_ms'] / tf_row['fwd_ms']:.2f}x, "
                f"forward+backward {r['fwd_bwd_ms'] / tf_row['fwd_bwd_ms']:.2f}x the time"
            )
    for backend in sorted({key[0] for key in by}):
        for subject in ["kernel"] + LAYERS:
            rows = [r for (b, s, t), r in by.items() if b == backend and s == subject and t >= 1024]
            if len(rows) > 1:
                costs = [per_token(r, "fwd_bwd") for r in rows]
                print(
                    f"{backend}, {subject}: forward+backward time per token, max/min over T>=1024 = "
                    f"{max(costs) / min(costs):.2f}"
                )


if __name__ == "__main__":
    main()
