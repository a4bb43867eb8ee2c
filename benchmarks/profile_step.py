"""Where a training step's time and memory go on each Keras backend, grouped by part of the model.

Runs `--warmup` steps of an architecture at a size (`--size`, the seed by default; the same compiled
`train_on_batch` as `training_step.py`), times `--steps` more, traces as many with the backend's own profiler,
and reads the trace back: each op's time, grouped into the token mixers' kernel, their projections (every matrix
product of a mixer with a weight), the feed-forward networks, the norms, the output head with its loss, the
optimizer and the rest, forward and backward apart, and the most expensive ops. The wall-clock step is printed
beside them.

- TensorFlow without XLA: `tf.profiler`'s trace (`*.xplane.pb`), every TensorFlow op's time on the executor
  threads (summed over threads), by its op name.
- `--jit-compile` (TensorFlow or JAX): XLA's own ops and fusions, their time on the GPU's timeline (the
  `/device:GPU:0` plane: kernel time, without the host's launch overhead) or, without a GPU, on the host threads
  that run XLA's CPU code. Each is traced back to the op it came from (the `op_name` of XLA's HLO: TensorFlow's
  trace carries it, JAX's comes from XLA's HLO dump, `jax_profile.py`, without TensorFlow). Beside it: the model
  FLOPs utilisation, 6 x parameters x tokens a step over the untraced step time, against the GPU's dense
  bfloat16 peak.
- PyTorch (`KERAS_BACKEND=torch`, eager): `torch.profiler`'s trace, every ATen op's own time, by the layer
  around it (`torch_profile.py`: each layer's call is wrapped in a range of its path, and a backward op belongs
  to the forward op that made its autograd node).

`--memory` lists the tensors alive at the step's memory peak, by part and by the op that made them: what the
backward pass keeps from the forward pass, and the working memory around the peak. TensorFlow's come from its
allocator's events and PyTorch's from the profiler's (on one more step, traced apart: recording allocations
slows every op), each counting what the traced steps allocated; JAX's are XLA's temporaries at their peak, from
the buffer assignment and live ranges XLA dumps (the weights and the optimizer's slots live outside them).

    python benchmarks/profile_step.py --architecture elita --memory
    KERAS_BACKEND=jax python benchmarks/profile_step.py --architecture elita --jit-compile --memory
    KERAS_BACKEND=torch python benchmarks/profile_step.py --architecture elita --memory
    python benchmarks/profile_step.py --architecture transformer --output-head full
    python benchmarks/profile_step.py --jit-compile --size 25m --sequence-length 8192 --batch-size 2 \
        --dtype-policy mixed_bfloat16 --top 20 --out raw.jsonl        # the GPU script's profile
"""

import argparse
import collections
import glob
import json
import os
import re
import statistics
import tempfile
import time

import jax_profile
import torch_profile
from measure import alive_at_peak, environment, most_common, op_names, synthetic_batch, training_model

from elita_tf.models import MODEL_SIZES

def _load_space(logdir):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    (path,) = glob.glob(f"{logdir}/plugins/profile/*/*.xplane.pb")
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space


def _any_block(name):
    """`name` with its block number replaced by `*`, so that the same op of every block adds up."""
    return re.sub(r"block_\d+(_\d+)?", "block_*", name)


def _stat_value(plane, stat):
    if stat.ref_value:  # strings that repeat (op names) are stored once, in the plane's metadata
        return plane.stat_metadata[stat.ref_value].name
    return stat.str_value or stat.int64_value or stat.uint64_value


def read_peak_tensors(logdir):
    """`(peak bytes, {op name: bytes})`: the allocations alive at the traced steps' highest total, by the op that
    made them."""
    events = []
    for plane in _load_space(logdir).planes:
        stat_names = {key: value.name for key, value in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                kind = plane.event_metadata[event.metadata_id].name
                if kind in ("MemoryAllocation", "MemoryDeallocation"):
                    stats = {stat_names.get(s.metadata_id): _stat_value(plane, s) for s in event.stats}
                    events.append((line.timestamp_ns * 1000 + event.offset_ps, kind, stats))
    allocations = [
        (
            (stats.get("allocator_name"), stats.get("addr")),
            int(stats.get("requested_bytes") or 0) if kind == "MemoryAllocation" else 0,
            str(stats.get("tf_op")),
        )
        for _, kind, stats in sorted(events, key=lambda e: e[0])
    ]
    peak, live = alive_at_peak(allocations)
    by_op = collections.Counter()
    for size, op in live:
        by_op[op.split(":")[0]] += size
    return peak, by_op


def read_op_times(logdir):
    """`{(op name, op type): picoseconds}` over the executor threads of the host trace."""
    times = collections.Counter()
    for plane in _load_space(logdir).planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name and not name.startswith("ExecutorState"):
                    times[tuple(name.rsplit(":", 1))] += event.duration_ps
    return times


# XLA's ops, by the TensorFlow op each came from, in this order (the first match wins). The mixers' matrix
# products with a weight are told from the kernel's own by their contraction (`_is_projection`).
XLA_PARTS = [
    ("norms", r"mixer_norm|ffn_norm|final_norm|layer_norm_gradient"),
    ("output head and loss", r"cross_entropy|(?:^|/)logits"),
    ("token mixer", r"block_\d+(?:_\d+)?/mixer|causal_mean_gradient|gated_projection_gradient"),
    ("feed-forward", r"block_\d+(?:_\d+)?/ffn|wide_ffn|pairwise_product|pairwise_projection"),
    ("optimizer", r"(?:^|/)adam|optimizer|AssignVariable|ReadVariable"),
]
XLA_PART_NAMES = [
    "token mixer kernel",
    "projections",
    "feed-forward",
    "norms",
    "output head and loss",
    "optimizer",
    "rest",
]
# Mixers' projection layers by name: ELiTA's (k1, k2, k3, value, output) and MultiHeadAttention's.
PROJECTION_LAYERS = (
    r"/mixer(?:_\d+)?/(?:attention(?:_\d+)?/)?(?:k1|k2|k3|value|output|query|key|attention_output)(?:_\d+)?/"
)
# Dense bfloat16 peaks (TFLOP/s) by device name, without sparsity: the model FLOPs utilisation's denominator.
BF16_PEAK_TFLOPS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0)]
# Control flow that runs other instructions (whose events hold those instructions' time as well).
_CONTAINERS = ("while", "conditional", "call", "async-start", "async-update", "async-done")


def part_of(op_name):
    """The part of `XLA_PART_NAMES` that a TensorFlow op (of a step without XLA) belongs to, by its name."""
    for part, pattern in XLA_PARTS:
        if re.search(pattern, op_name):
            if part == "token mixer":
                return "projections" if re.search(PROJECTION_LAYERS, op_name) else "token mixer kernel"
            return part
    return "rest"


def bf16_peak_tflops(device):
    """The dense bfloat16 peak of `device` (a name such as "NVIDIA H100 80GB HBM3"), or None if not known."""
    for name, peak in BF16_PEAK_TFLOPS:
        if name in device:
            return peak
    return None


def _product_shape(instruction, operands, computations):
    """`(contraction size, batched)` of the matrix product `instruction` is or fuses, or None for no product.

    A product is an HLO `dot`, a fusion that holds one (XLA's Triton GEMMs), or a cuBLAS custom call, whose
    dimension numbers are in its backend config. `operands` maps the ids of the instructions of
    `instruction`'s computation to them; `computations` maps every computation's id to `(computation, operands)`.
    """
    if instruction.opcode == "dot":
        numbers = instruction.dot_dimension_numbers
        contracting, batch = list(numbers.lhs_contracting_dimensions), list(numbers.lhs_batch_dimensions)
    elif instruction.opcode == "custom-call" and re.search("gemm|matmul", instruction.custom_call_target, re.I):
        try:
            config = json.loads(instruction.backend_config or b"{}")
        except ValueError:
            return None
        numbers = config.get("gemm_backend_config", config).get("dot_dimension_numbers", {})
        contracting = [int(d) for d in numbers.get("lhs_contracting_dimensions", [])]
        batch = numbers.get("lhs_batch_dimensions", [])
    elif instruction.opcode == "fusion":
        for computation_id in instruction.called_computation_ids:
            fused, fused_operands = computations[computation_id]
            for inner in fused.instructions:
                found = _product_shape(inner, fused_operands, computations)
                if found:
                    return found
        return None
    else:
        return None
    lhs = operands.get(instruction.operand_ids[0]) if instruction.operand_ids else None
    if lhs is None or not contracting or max(contracting) >= len(lhs.shape.dimensions):
        return None
    size = 1
    for dimension in contracting:
        size *= lhs.shape.dimensions[dimension]
    return size, bool(batch)


def _is_projection(op_name, product, widths, length):
    """Whether a mixer's op is a product with a weight: a named projection, or a product over the model width
    (or the heads' total width), or one over every token without batch dimensions (a weight's gradient)."""
    if re.search(PROJECTION_LAYERS, op_name):
        return True
    if product is None:
        return False
    size, batched = product
    return size in widths or (not batched and size >= length)


def xla_instructions(space):
    """`{(module name, instruction name): (op name, opcode, product)}` from the HLO modules a trace holds.

    A fusion without an op name of its own takes its fused root's (or else its fused instructions' most
    common one). `product` is `_product_shape`'s.
    """
    from tensorflow.compiler.xla.service import hlo_pb2

    instructions = {}
    for plane in space.planes:
        if plane.name != "/host:metadata":
            continue
        for metadata in plane.event_metadata.values():
            for stat in metadata.stats:
                if not stat.bytes_value:
                    continue
                proto = hlo_pb2.HloProto()
                proto.ParseFromString(stat.bytes_value)
                module = proto.hlo_module
                computations = {c.id: (c, {i.id: i for i in c.instructions}) for c in module.computations}
                for computation, by_id in computations.values():
                    names = op_names(
                        {i.id: _own_op_name(i, computations) for i in computation.instructions},
                        {i.id: list(i.operand_ids) for i in computation.instructions},
                    )
                    for i in computation.instructions:
                        product = _product_shape(i, by_id, computations)
                        instructions[module.name, i.name] = (names[i.id], i.opcode, product)
    return instructions


def _own_op_name(instruction, computations):
    """The TensorFlow op an HLO instruction came from; for a fusion without one, its root's or its parts' most
    common one."""
    if instruction.metadata.op_name or not instruction.called_computation_ids:
        return instruction.metadata.op_name
    fused, fused_by_id = computations[instruction.called_computation_ids[0]]
    root = fused_by_id.get(fused.root_id)
    return (root.metadata.op_name if root else "") or most_common(i.metadata.op_name for i in fused.instructions)


def read_xla_times(logdir, device):
    """`({(module, instruction): picoseconds}, plane name)`: XLA's ops on the GPU's timeline, or the host's.

    On a GPU the time is each kernel's (and copy's) on the device, read from its streams; on a CPU, each
    XLA instruction's on the threads that ran it.
    """
    space = _load_space(logdir)
    want = "/device:GPU:0" if device == "gpu" else "/host:CPU"
    times = collections.Counter()
    for plane in space.planes:
        if plane.name != want:
            continue
        stat_names = {key: value.name for key, value in plane.stat_metadata.items()}
        lines = [line for line in plane.lines if line.name.startswith("Stream")] or list(plane.lines)
        for line in lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                stats = {stat_names.get(s.metadata_id): _stat_value(plane, s) for s in event.stats}
                if "hlo_op" in stats:
                    times[str(stats.get("hlo_module", "")), str(stats["hlo_op"])] += event.duration_ps
                elif device == "gpu":  # a kernel or copy outside XLA's compiled step
                    times["", name] += event.duration_ps
    return times, want, space


def xla_profile(times, instructions, widths, length):
    """Per XLA op: `[(part, direction, op name, opcode, picoseconds)]`.

    `times` and `instructions` are `read_xla_times`' and `xla_instructions`' (or `jax_profile`'s). A JAX op
    name wraps its layers in its transformations (`transpose(jvp(block_0))/mixer/...` is backward): they are
    read without the wrappers.
    """
    by_name = {name: value for (_, name), value in instructions.items()}
    # A kernel without XLA's annotation is still named after its fusion ("loop_add_fusion.3": "loop_add_fusion_3").
    by_kernel = {re.sub(r"[.-]", "_", name): value for name, value in by_name.items()}
    rows = []
    for (module, name), ps in times.items():
        op_name, opcode, product = (
            instructions.get((module, name)) or by_name.get(name) or by_kernel.get(name) or ("", "", None)
        )
        if opcode in _CONTAINERS or name.startswith("end: "):
            continue
        scopes = re.sub(r"\b(?:jvp|transpose|jit|pjit|remat|checkpoint|vmap)\(|\)", "", op_name)
        part = "rest"
        for candidate, pattern in XLA_PARTS:
            if re.search(pattern, scopes):
                part = candidate
                break
        if part == "token mixer":
            part = "projections" if _is_projection(scopes, product, widths, length) else "token mixer kernel"
        direction = "backward" if "gradient" in op_name or "transpose(" in op_name else "forward"
        rows.append((part, direction, op_name or name, opcode or "kernel", ps))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architecture", default="elita")
    parser.add_argument("--size", default="seed", choices=sorted(MODEL_SIZES), help="width, depth and heads")
    parser.add_argument("--sequence-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--vocabulary-size", type=int, default=5000)
    parser.add_argument("--hidden-dim", type=int)
    parser.add_argument("--num-layers", type=int)
    parser.add_argument("--num-heads", type=int)
    parser.add_argument("--head-dim", type=int)
    parser.add_argument("--output-head", choices=["chunked", "full"], default="chunked")
    parser.add_argument("--dtype-policy", default="float32")
    parser.add_argument("--jit-compile", action="store_true", help="compile the step with XLA and list XLA's ops")
    parser.add_argument("--warmup", type=int, default=2, help="steps before the timed ones (the first compiles)")
    parser.add_argument("--steps", type=int, default=3, help="steps timed without the profiler, then traced")
    parser.add_argument("--top", type=int, default=15, help="how many of the most expensive ops to list")
    parser.add_argument("--memory", action="store_true", help="also list the tensors alive at the memory peak")
    parser.add_argument("--out", help="also append the results to this file as one JSON line")
    args = parser.parse_args()
    for name, value in MODEL_SIZES[args.size].items():
        if getattr(args, name) is None:
            setattr(args, name, value)

    import keras

    backend = keras.backend.backend()
    if backend == "jax" and not args.jit_compile:
        parser.error("on jax, profile the compiled step (--jit-compile)")
    if backend == "torch" and args.jit_compile:
        parser.error("on torch, profile the eager step (without --jit-compile): torch.compile's kernels have no layers")
    dump_dir = tempfile.mkdtemp(prefix="elita-hlo-") if backend == "jax" else None
    if dump_dir:  # before the step compiles: its HLO, for the op names
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {jax_profile.dump_flags(dump_dir)}"
    model = training_model(
        args.architecture,
        args.output_head,
        args.dtype_policy,
        jit_compile=args.jit_compile,
        vocabulary_size=args.vocabulary_size,
        hidden_dim=args.hidden_dim,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        head_dim=args.head_dim,
        max_sequence_length=args.sequence_length,
    )
    x, y = synthetic_batch(args.batch_size, args.sequence_length, args.vocabulary_size)
    start = time.perf_counter()
    for _ in range(args.warmup):
        model.train_on_batch(x, y)
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        float(model.train_on_batch(x, y))  # waits for the step
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    logdir = tempfile.mkdtemp(prefix="elita-profile-")
    start = time.perf_counter()
    if backend == "torch":
        remove = torch_profile.annotate(model)
        trace_path, memory_path = os.path.join(logdir, "trace.json"), os.path.join(logdir, "memory.json")
        losses = []
        torch_profile.trace(lambda: losses.append(float(model.train_on_batch(x, y))), args.steps, trace_path)
        wall = (time.perf_counter() - start) / args.steps
        if args.memory:  # one more step, its allocations traced
            torch_profile.trace(lambda: losses.append(float(model.train_on_batch(x, y))), 1, memory_path, memory=True)
        remove()
        loss = losses[-1]
    else:
        if backend == "jax":
            import jax

            jax.profiler.start_trace(logdir)
        else:
            import tensorflow as tf

            # Host tracer level 3 records the allocator's events (`--memory`).
            options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=3 if args.memory else 2)
            tf.profiler.experimental.start(logdir, options)
        for _ in range(args.steps):
            loss = float(model.train_on_batch(x, y))
        if backend == "jax":
            jax.profiler.stop_trace()
        else:
            tf.profiler.experimental.stop()
        wall = (time.perf_counter() - start) / args.steps
    ms = lambda ps: ps / 1e9 / args.steps  # noqa: E731  (per step)

    result = {
        "profile": args.architecture,
        "size": args.size,
        "T": args.sequence_length,
        "B": args.batch_size,
        "dtype_policy": args.dtype_policy,
        "jit_compile": args.jit_compile,
        "output_head": args.output_head,
        "params": model.backbone.count_params(),
        "warmup_s": compile_s,
        "step_s": step_s,
        "profiled_step_s": wall,
        "loss": loss,
        **environment(),
    }
    print(
        f"# {args.architecture} on {backend}, B={args.batch_size} T={args.sequence_length} V={args.vocabulary_size} "
        f"d={args.hidden_dim} L={args.num_layers} H={args.num_heads} D={args.head_dim}, {args.output_head} head, "
        f"{args.dtype_policy}{', XLA' if args.jit_compile else ''}, on {result['device']}"
    )
    if backend == "torch":
        ops, _, _ = torch_profile.read_trace(trace_path)
        rows = [(torch_part(name), direction, name, op, us * 1e6) for name, direction, op, us in ops]
        _print_ops(args, result, rows, "the host threads (ATen ops' own time)", ms)
        if args.memory:
            _, peak, live = torch_profile.read_trace(memory_path)
            rows = [(torch_part(name), made_in, name, op, size) for (name, made_in, op), (size, _) in live.items()]
            _print_peak(args, result, peak, rows, "the tensors allocated since the trace began")
    elif args.jit_compile:
        on = "cpu" if result["device"] == "CPU" else "gpu"
        if backend == "jax":
            times, plane = jax_profile.read_times(logdir, on)
            instructions = jax_profile.hlo_instructions(dump_dir)
        else:
            times, plane, space = read_xla_times(logdir, on)
            instructions = xla_instructions(space)
        widths = {args.hidden_dim, args.num_heads * args.head_dim}
        rows = xla_profile(times, instructions, widths, args.sequence_length)
        _print_ops(args, result, rows, plane, ms, kind="XLA")
        if args.memory:  # JAX's: XLA's arena of temporaries
            arena, peak, live = jax_profile.peak_temporaries(dump_dir)
            rows = [(part, made_in, name, opcode, size) for part, made_in, name, opcode, size in xla_profile(
                live, instructions, widths, args.sequence_length)]
            _print_peak(args, result, peak, rows, f"XLA's temporaries, in an arena of {arena / 2**20:.0f} MiB")
    else:
        _print_executor(args, result, read_op_times(logdir), wall, ms)
    if args.memory and backend == "tensorflow":
        peak, by_op = read_peak_tensors(logdir)
        rows = [
            (part_of(name), "backward" if "gradient" in name else "forward", *name.rsplit("/", 1), size)
            for name, size in by_op.items()
        ]
        counted = "the tensors TensorFlow's allocator held, allocated since the trace began"
        _print_peak(args, result, peak, rows, counted)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(result) + "\n")


def _print_executor(args, result, times, wall, ms):
    """The TensorFlow executor's op times (a step without XLA), grouped into `XLA_PART_NAMES` as XLA's are."""
    total = sum(times.values())
    per_part = collections.Counter()
    for (name, _), ps in times.items():
        direction = "backward" if "gradient" in name else "forward"  # tape gradients and custom ones
        per_part[part_of(name), direction] += ps
    print(f"# wall-clock step (profiled) {wall * 1000:.0f} ms; op time over all threads {ms(total):.0f} ms a step")
    print("| part | forward ms | backward ms | share of op time |")
    print("|---|---|---|---|")
    parts = {}
    for part in XLA_PART_NAMES:
        forward, backward = per_part[part, "forward"], per_part[part, "backward"]
        share = 100 * (forward + backward) / total if total else 0.0
        print(f"| {part} | {ms(forward):.0f} | {ms(backward):.0f} | {share:.0f}% |")
        parts[part] = {"forward_ms": ms(forward), "backward_ms": ms(backward)}
    print(f"\nThe {args.top} most expensive ops (numbered copies of one op summed):")
    by_op = collections.Counter()
    for (name, kind), ps in times.items():
        by_op[_any_block(re.sub(r"_\d+(?=/|$)", "", name)), kind] += ps
    top = by_op.most_common(args.top)
    for (name, kind), ps in top:
        print(f"{ms(ps):7.1f} ms  {kind:28s} {name}")
    result.update(
        plane="executor threads",
        op_ms=ms(total),
        parts=parts,
        top=[{"op": name, "kind": kind, "ms": ms(ps)} for (name, kind), ps in top],
    )


def torch_part(range_name):
    """The part of `XLA_PART_NAMES` that a PyTorch op in `torch_profile`'s range `range_name` belongs to."""
    if range_name == torch_profile.OPTIMIZER_RANGE:
        return "optimizer"
    if range_name == torch_profile.LOSS_RANGE or re.search(r"(?:^|/)logits", range_name):
        return "output head and loss"
    if re.search(r"mixer_norm|ffn_norm|final_norm", range_name):
        return "norms"
    if re.search(r"block_\d+(?:_\d+)?/mixer", range_name):
        return "projections" if re.search(PROJECTION_LAYERS, f"/{range_name}/") else "token mixer kernel"
    if re.search(r"block_\d+(?:_\d+)?/ffn", range_name):
        return "feed-forward"
    return "rest"


def _print_peak(args, result, peak, rows, counted):
    """The tensors alive at a step's memory peak, `rows` of `(part, made in, layer, op, bytes)`, by part and by op.

    `counted` says what the peak counts (printed beside it).
    """
    by_op, by_part = collections.Counter(), collections.Counter()
    for part, direction, layer, op, size in rows:
        by_op[part, direction, _any_block(layer), op] += size
        by_part[part] += size
    print(f"\n{peak / 2**20:.0f} MiB alive at the peak ({counted}), by part:")
    print(" | ".join(f"{part} {size / 2**20:.0f} MiB" for part, size in by_part.most_common()))
    print(f"The {args.top} largest by op (the same op of every block summed; made in the forward or backward pass):")
    print("| MiB | part | made in | layer | op |")
    print("|---|---|---|---|---|")
    top = by_op.most_common(args.top)
    for (part, direction, layer, op), size in top:
        print(f"| {size / 2**20:.1f} | {part} | {direction} | {layer or '-'} | {op} |")
    result.update(
        peak_tensor_mib=peak / 2**20,
        peak_counts=counted,
        peak_by_part={part: size / 2**20 for part, size in by_part.items()},
        peak_top=[{"part": p, "made_in": d, "layer": r, "op": o, "mib": s / 2**20} for (p, d, r, o), s in top],
    )


def _print_ops(args, result, rows, plane, ms, kind="PyTorch"):
    """`kind`'s op times on `plane`, grouped into `XLA_PART_NAMES`, the most expensive ops, and the FLOPs
    utilisation."""
    total = sum(row[-1] for row in rows)
    tokens = args.batch_size * args.sequence_length
    flop = 6 * result["params"] * tokens
    peak = bf16_peak_tflops(result["device"])
    achieved = flop / result["step_s"] / 1e12
    result.update(
        plane=plane,
        op_ms=ms(total),
        tokens=tokens,
        model_tflop=flop / 1e12,
        tflops=achieved,
        peak_tflops=peak,
        floor_ms=flop / (peak * 1e12) * 1e3 if peak else None,
        mfu=achieved / peak if peak else None,
    )
    print(
        f"# step {result['step_s'] * 1e3:.1f} ms untraced (median of {args.steps}), "
        f"{result['profiled_step_s'] * 1e3:.1f} ms traced; {kind} op time on {plane} {ms(total):.1f} ms a step"
    )
    print(
        f"# {result['params']:,} parameters x {tokens:,} tokens a step: 6 x params x tokens = {flop / 1e12:.2f} TFLOP, "
        f"{achieved:.1f} TFLOP/s"
        + (
            f"; at {peak:.0f} TFLOP/s (dense bfloat16) the matrix products alone take {result['floor_ms']:.2f} ms: "
            f"model FLOPs utilisation {100 * result['mfu']:.1f}%"
            if peak
            else f"; no dense bfloat16 peak known for {result['device']}"
        )
    )
    per_part = collections.Counter()
    for part, direction, _, _, ps in rows:
        per_part[part, direction] += ps
    print("| part | forward ms | backward ms | share of op time |")
    print("|---|---|---|---|")
    parts = {}
    for part in XLA_PART_NAMES:
        forward, backward = per_part[part, "forward"], per_part[part, "backward"]
        parts[part] = {"forward_ms": ms(forward), "backward_ms": ms(backward)}
        share = 100 * (forward + backward) / total if total else 0.0
        print(f"| {part} | {ms(forward):.2f} | {ms(backward):.2f} | {share:.0f}% |")
    print(f"\nThe {args.top} most expensive {kind} ops (the same op of every block summed):")
    by_op = collections.Counter()
    for part, _, name, opcode, ps in rows:
        by_op[part, opcode, _any_block(re.sub(r"_\d+(?=/|$)", "", name))] += ps
    top = by_op.most_common(args.top)
    print(f"| ms a step | share | part | {kind} op | op (its layers) |")
    print("|---|---|---|---|---|")
    for (part, opcode, name), ps in top:
        print(f"| {ms(ps):.3f} | {100 * ps / total:.1f}% | {part} | {opcode} | {name} |")
    result.update(parts=parts, top=[{"op": n, "kind": o, "part": p, "ms": ms(ps)} for (p, o, n), ps in top])


if __name__ == "__main__":
    main()
