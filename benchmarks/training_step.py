"""Training-step time and peak memory of architectures against T, at a constant number of tokens a batch.

Each (architecture, T) runs in its own process: a compiled `train_step` (Adam, the ELiTA schedule,
cross-entropy) on random token ids, median of `--repeats` steps after the first (compile)
one, and the peak resident set size above the process's baseline (on a GPU, the peak
memory TensorFlow held there). The tensor peak is the most memory TensorFlow's allocator held
for the timed steps' tensors: the model's own memory, without the process's libraries, traced
graphs and caches. On PyTorch's CPU it comes from the profiler's allocation events over one more
step (`measure.torch_cpu_tensor_peak_mib`); JAX keeps none on a CPU.

    python benchmarks/training_step.py --architectures elita transformer --sequence-lengths 256 1024 4096
    python benchmarks/training_step.py --size 25m --sequence-lengths 2048 8192 16384 --tokens 16384

`--backends tensorflow jax torch` measures each (architecture, T) on each Keras backend in turn, each in a
process of its own, and prints each architecture's ratios to the last one on the same backend and each
backend's to TensorFlow for the same architecture. JAX's step is always compiled (XLA, as `elita-train`
compiles it there); `--jit-compile` compiles TensorFlow's with XLA and PyTorch's with `torch.compile`.

    python benchmarks/training_step.py --sequence-lengths 256 --size seed --repeats 5 --backends tensorflow jax torch

`--devices 1 2 4` measures JAX's step data parallel (`keras.distribution.DataParallel`) over that many devices
(`--model-parallel K`: on a mesh of `(N / K, K)`, `ElitaBackbone.get_layout_map`), the same global batch, each
count against one device. A CPU gets that many XLA host devices, which share its cores: it shows the overhead of
the collectives, not a speed-up.

    python benchmarks/training_step.py --backends jax --sequence-lengths 256 --devices 1 2 4

`--size` takes a width, depth and head count from `elita_tf.models.MODEL_SIZES` ("seed", "25m",
"100m"); `--hidden-dim` and the others set them one by one.
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
    rss_mib,
    run_measurement,
    synthetic_batch,
    tensor_memory,
    time_left,
    torch_cpu_tensor_peak_mib,
    training_model,
    use_gpu_peak,
)

from elita_tf.models import MODEL_SIZES


def run_one(args):
    base = rss_mib()
    batch = max(1, args.tokens // args.sequence_length)
    import keras  # after the baseline, which leaves the libraries out

    keras.utils.set_random_seed(0)  # the same weights in every process: its loss is comparable (`ab.py`)
    size = dict(
        vocabulary_size=args.vocabulary_size,
        hidden_dim=args.hidden_dim,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        head_dim=args.head_dim,
        max_sequence_length=args.sequence_length,
    )
    with _distribution(args, size):
        jit_compile = args.jit_compile or keras.backend.backend() == "jax"
        model = training_model(args.architecture, args.output_head, args.dtype_policy, jit_compile=jit_compile, **size)
        x, y = synthetic_batch(batch, args.sequence_length, args.vocabulary_size)
        memory = tensor_memory()
        times = []
        for step in range(args.repeats + 1):
            start = time.perf_counter()
            loss = float(model.train_on_batch(x, y))
            times.append(time.perf_counter() - start)
            if step == 0 and memory:  # from here on, the allocator's peak is the steps' own tensors
                memory.reset()
    tensor_peak_mib = memory.peak_mib() if memory else None
    if tensor_peak_mib is None and keras.backend.backend() == "torch":
        tensor_peak_mib = torch_cpu_tensor_peak_mib(lambda: model.train_on_batch(x, y))
    result = {
        "backend": keras.backend.backend(),
        "architecture": args.architecture,
        "output_head": args.output_head,
        "jit_compile": args.jit_compile or keras.backend.backend() == "jax",
        "dtype_policy": args.dtype_policy,
        "T": args.sequence_length,
        "B": batch,
        "params": model.backbone.count_params(),
        "compile_s": times[0],
        "step_s": statistics.median(times[1:]),
        "loss": loss,
        "size": args.size,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "devices": args.device_count,
        "model_parallel": args.model_parallel,
        **environment(),
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base,
        # The most memory the steps' tensors held at once, without the process's libraries, graphs and caches.
        "tensor_peak_mib": tensor_peak_mib,
    }
    print(json.dumps(use_gpu_peak(result)))


def _distribution(args, size):
    """The scope of `--devices`' distribution (JAX's `keras.distribution`), or none."""
    import contextlib

    import keras

    if args.device_count in (None, 1):  # one device as elita-train has it: no distribution
        return contextlib.nullcontext()
    devices = keras.distribution.list_devices()[: args.device_count]
    if args.model_parallel == 1:
        return keras.distribution.DataParallel(devices=devices).scope()
    from elita_tf.models import ElitaBackbone, architecture_config

    axes = (args.device_count // args.model_parallel, args.model_parallel)
    mesh = keras.distribution.DeviceMesh(axes, ("batch", "model"), devices)
    layout_map = ElitaBackbone.get_layout_map(mesh, config=architecture_config(args.architecture, **size))
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch").scope()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architectures", nargs="+", default=["elita", "transformer"])
    parser.add_argument("--sequence-lengths", nargs="+", type=int, default=[256, 1024, 4096])
    parser.add_argument("--tokens", type=int, default=32768, help="tokens a batch: B = tokens // T")
    parser.add_argument("--vocabulary-size", type=int, default=5000)
    parser.add_argument("--size", default="seed", choices=sorted(MODEL_SIZES), help="width, depth and heads")
    parser.add_argument("--hidden-dim", type=int)
    parser.add_argument("--num-layers", type=int)
    parser.add_argument("--num-heads", type=int)
    parser.add_argument("--head-dim", type=int)
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
    parser.add_argument(
        "--backends",
        nargs="+",
        default=[os.environ.get("KERAS_BACKEND", "tensorflow")],
        choices=["tensorflow", "jax", "torch"],
        help="the Keras backends to measure on, each in turn (default: KERAS_BACKEND's, else TensorFlow)",
    )
    parser.add_argument("--out", help="also append the JSON lines to this file")
    parser.add_argument(
        "--devices", nargs="+", type=int, help="JAX: data parallel over each of these numbers of devices in turn"
    )
    parser.add_argument("--model-parallel", type=int, default=1, help="with --devices: the mesh's model axis")
    parser.add_argument("--device-count", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--deadline", type=float, help="a Unix time: every measurement ends by it, none starts in the minute before it"
    )
    parser.add_argument("--architecture", help=argparse.SUPPRESS)
    parser.add_argument("--sequence-length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--output-head", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name, value in MODEL_SIZES[args.size].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.architecture:
        return run_one(args)

    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    print(
        f"# size={args.size} tokens/batch={args.tokens} vocab={args.vocabulary_size} d={args.hidden_dim} "
        f"L={args.num_layers} H={args.num_heads} D={args.head_dim} "
        f"jit_compile={args.jit_compile} dtype_policy={args.dtype_policy} XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}"
    )
    header = "| backend | architecture | output head | T | B | params | step s | tokens/s | peak MiB | "
    print(header + "tensor peak MiB | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    results = {}
    if args.devices and args.backends != ["jax"]:
        parser.error(f"--devices is keras.distribution's, on JAX: give --backends jax. Received: {args.backends}")
    for length in args.sequence_lengths:
        for head in args.output_heads:
            for backend in args.backends:
                for devices in args.devices or [None]:
                    for name in args.architectures:
                        r = _measure(args, name, head, length, backend, devices)
                        if r is not None:
                            results[backend if devices is None else f"{backend} on {devices}", name, head, length] = r
    if results:
        print(describe_environment(next(iter(results.values()))))
    _print_ratios(results, args.architectures[-1])
    for (label, name, head, length), r in results.items():
        one = results.get((f"jax on {args.devices[0]}" if args.devices else None, name, head, length))
        if args.devices and one is not None and r is not one:
            ratio = r["step_s"] / one["step_s"]
            print(f"{name}, T={length}: {label} / jax on {args.devices[0]}: step time {ratio:.2f}x")


def _measure(args, name, head, length, backend, devices=None):
    """One (architecture, head, T) on one backend (and number of JAX devices), in a process of its own: its row
    printed, its result returned."""
    row = f"| {backend if devices is None else f'{backend} on {devices}'} | {name} | {head} | {length} |"
    timeout = time_left(args.deadline, args.timeout)
    if timeout is None:
        print(f"{row} | skipped: past the deadline | | | | | | |", flush=True)
        return None
    cmd = [sys.executable, __file__, "--architecture", name, "--sequence-length", str(length)]
    cmd += ["--output-head", head, "--size", args.size]
    for flag in ["tokens", "vocabulary_size", "hidden_dim", "num_layers", "num_heads", "head_dim", "repeats"]:
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    cmd += ["--dtype-policy", args.dtype_policy] + (["--jit-compile"] if args.jit_compile else [])
    env = dict(os.environ, KERAS_BACKEND=backend)  # the child's backend
    if devices is not None:  # on a CPU, that many XLA host devices (the flag leaves accelerators as they are)
        cmd += ["--device-count", str(devices), "--model-parallel", str(args.model_parallel)]
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    r, reason = run_measurement(cmd, timeout, env)
    if r is None:
        print(f"{row} | {reason} | | | | | | |", flush=True)
        return None
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(r) + "\n")
    print(
        f"{row} {r['B']} | {r['params']:,} | {r['step_s']:.3g} | {r['B'] * length / r['step_s']:,.0f} | "
        f"{r['peak_mib']:,.0f} | {r['tensor_peak_mib'] or 0:,.0f} | {r['compile_s']:.1f} |",
        flush=True,
    )
    return r


def _print_ratios(results, base):
    """Each architecture's step time and memory against `base`'s on its backend, and each backend's against
    TensorFlow's for the same architecture."""

    def ratios(r, other):
        text = f"step time {r['step_s'] / other['step_s']:.2f}x, peak memory {r['peak_mib'] / other['peak_mib']:.2f}x"
        if r["tensor_peak_mib"] and other["tensor_peak_mib"]:
            text += f", tensor peak {r['tensor_peak_mib'] / other['tensor_peak_mib']:.2f}x"
        return text

    for (backend, name, head, length), r in sorted(results.items(), key=lambda kv: kv[0][3]):
        if name != base and (backend, base, head, length) in results:
            other = results[backend, base, head, length]
            print(f"{backend}, T={length}, {head} head: {name} / {base}: {ratios(r, other)}")
    for (backend, name, head, length), r in sorted(results.items(), key=lambda kv: kv[0][3]):
        if backend != "tensorflow" and ("tensorflow", name, head, length) in results:
            print(
                f"{name}, T={length}, {head} head: {backend} / tensorflow: "
                f"{ratios(r, results['tensorflow', name, head, length])}"
            )


if __name__ == "__main__":
    main()
