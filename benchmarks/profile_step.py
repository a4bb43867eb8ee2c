"""Where a training step's time goes: the TensorFlow profiler's op times, grouped by part of the model.

Runs `--warmup` steps of an architecture at the seed configuration (the same compiled `train_on_batch`
as `training_step.py`), traces `--steps` more with `tf.profiler`, and reads the trace
(`*.xplane.pb`) back: every TensorFlow op's time on the executor threads, grouped into the
token mixers, the feed-forward networks, the norms, the output head with its loss, the
optimizer and the rest, forward and backward apart, and the most expensive ops. Times are
op time summed over threads, per step; the wall-clock step is printed beside them.

`--memory` also reads the allocator's events from the same trace and lists the tensors alive
at the step's memory peak, by the op that made them: what the backward pass keeps from the
forward pass, and the working memory around the peak.

    python benchmarks/profile_step.py --architecture elita
    python benchmarks/profile_step.py --architecture elita --dtype-policy mixed_bfloat16 --memory
    python benchmarks/profile_step.py --architecture transformer --output-head full
"""

import argparse
import collections
import glob
import re
import tempfile
import time

from measure import training_model

PARTS = [
    ("mixer norm", r"block_\d+(?:_\d+)?/mixer_norm"),
    ("ffn norm", r"block_\d+(?:_\d+)?/ffn_norm"),
    ("norms' custom gradients", r"layer_norm_gradient"),  # custom gradients run outside their layer's scope
    ("token mixers", r"block_\d+(?:_\d+)?/mixer|causal_mean_gradient|gated_projection_gradient"),
    ("feed-forward", r"block_\d+(?:_\d+)?/ffn|wide_ffn|pairwise_product|pairwise_projection"),
    ("output head and loss", r"cross_entropy|/logits|sparse_categorical|final_norm"),
    ("optimizer", r"adam|Adam|optimizer|AssignVariable|ReadVariable"),
    ("embedding", r"embedding"),
]


def part_of(op_name):
    for part, pattern in PARTS:
        if re.search(pattern, op_name):
            return part
    return "other"


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
    """`(peak bytes, {op name: (bytes, shape)})`: the allocations alive at the traced steps' highest total."""
    events = []
    for plane in _load_space(logdir).planes:
        stat_names = {key: value.name for key, value in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                kind = plane.event_metadata[event.metadata_id].name
                if kind in ("MemoryAllocation", "MemoryDeallocation"):
                    stats = {stat_names.get(s.metadata_id): _stat_value(plane, s) for s in event.stats}
                    events.append((line.timestamp_ns * 1000 + event.offset_ps, kind, stats))
    live, total, peak, at_peak = {}, 0, 0, {}
    for _, kind, stats in sorted(events, key=lambda e: e[0]):
        key = (stats.get("allocator_name"), stats.get("addr"))
        if kind == "MemoryAllocation":
            size = int(stats.get("requested_bytes") or 0)
            live[key] = (size, str(stats.get("tf_op")), stats.get("shape"))
            total += size
            if total > peak:
                peak, at_peak = total, dict(live)
        elif key in live:
            total -= live.pop(key)[0]
    by_op = collections.defaultdict(lambda: [0, None])
    for size, op, shape in at_peak.values():
        entry = by_op[_any_block(op.split(":")[0])]
        entry[0] += size
        entry[1] = shape
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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architecture", default="elita")
    parser.add_argument("--sequence-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--vocabulary-size", type=int, default=5000)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=6)
    parser.add_argument("--output-head", choices=["chunked", "full"], default="chunked")
    parser.add_argument("--dtype-policy", default="float32")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=15, help="how many of the most expensive ops to list")
    parser.add_argument("--memory", action="store_true", help="also list the tensors alive at the memory peak")
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    model = training_model(
        args.architecture,
        args.output_head,
        args.dtype_policy,
        vocabulary_size=args.vocabulary_size,
        hidden_dim=args.hidden_dim,
        num_layers=args.num_layers,
        max_sequence_length=args.sequence_length,
    )
    rng = np.random.default_rng(0)
    shape = (args.batch_size, args.sequence_length)
    token_ids = tf.constant(rng.integers(0, args.vocabulary_size, size=shape), tf.int32)
    x = {"token_ids": token_ids, "padding_mask": tf.ones_like(token_ids)}  # elita-train's batches
    y = tf.constant(rng.integers(0, args.vocabulary_size, size=shape), tf.int32)
    for _ in range(args.warmup):
        model.train_on_batch(x, y)
    logdir = tempfile.mkdtemp(prefix="elita-profile-")
    # Host tracer level 3 records the allocator's events (`--memory`).
    options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=3 if args.memory else 2)
    tf.profiler.experimental.start(logdir, options)
    start = time.perf_counter()
    for _ in range(args.steps):
        model.train_on_batch(x, y)
    wall = (time.perf_counter() - start) / args.steps
    tf.profiler.experimental.stop()

    times = read_op_times(logdir)
    total = sum(times.values())
    per_part = collections.Counter()
    for (name, _), ps in times.items():
        direction = "backward" if "gradient" in name else "forward"  # tape gradients and custom ones
        per_part[part_of(name), direction] += ps
    ms = lambda ps: ps / 1e9 / args.steps  # noqa: E731  (per step)

    print(
        f"# {args.architecture}, B={args.batch_size} T={args.sequence_length} V={args.vocabulary_size} "
        f"d={args.hidden_dim} L={args.num_layers}, {args.output_head} head, {args.dtype_policy}"
    )
    print(f"# wall-clock step (profiled) {wall * 1000:.0f} ms; op time over all threads {ms(total):.0f} ms a step")
    print("| part | forward ms | backward ms | share of op time |")
    print("|---|---|---|---|")
    for part in [p for p, _ in PARTS] + ["other"]:
        forward, backward = per_part[part, "forward"], per_part[part, "backward"]
        if forward + backward:
            share = 100 * (forward + backward) / total
            print(f"| {part} | {ms(forward):.0f} | {ms(backward):.0f} | {share:.0f}% |")
    print(f"\nThe {args.top} most expensive ops (numbered copies of one op summed):")
    by_op = collections.Counter()
    for (name, kind), ps in times.items():
        by_op[_any_block(re.sub(r"_\d+(?=/|$)", "", name)), kind] += ps
    for (name, kind), ps in by_op.most_common(args.top):
        print(f"{ms(ps):7.1f} ms  {kind:28s} {name}")
    if args.memory:
        peak, by_op = read_peak_tensors(logdir)
        print(f"\n{peak / 2**20:.0f} MiB of tensors alive at the traced steps' peak; the {args.top} largest by op:")
        for name, (size, shape) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[: args.top]:
            print(f"{size / 2**20:7.1f} MiB  {name}  {shape}")


if __name__ == "__main__":
    main()
