"""A JAX step's XLA ops and their times, read without TensorFlow: `profile_step.py`'s JAX side.

JAX's profiler (`jax.profiler.start_trace`) writes the trace, and `jax.profiler.ProfileData` (jaxlib's own
reader) reads its events back: each XLA instruction's time on the GPU's streams, or on the host's threads
that run XLA's CPU code. The instructions' op names (the Keras layers' name scopes; `transpose(jvp(...))`
for the backward pass) come from the optimised HLO that XLA dumps as text (`dump_flags`), since a JAX
trace carries no HLO of its own.
"""

import collections
import glob
import os
import re

from measure import most_common, op_names

# The HLO text of every compiled module whose name holds "train" (Keras' `jit_train_step`), after XLA's passes.
DUMP_FLAGS = "--xla_dump_to={} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*train.*"


def dump_flags(dump_dir):
    """XLA_FLAGS that dump the train step's optimised HLO into `dump_dir`: set before JAX compiles it."""
    return DUMP_FLAGS.format(dump_dir)


def read_times(logdir, device):
    """`({(module, instruction): picoseconds}, plane name)` from the trace under `logdir`, as `read_xla_times`."""
    import jax

    (path,) = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    want = "/device:GPU:0" if device == "gpu" else "/host:CPU"
    times = collections.Counter()
    for plane in jax.profiler.ProfileData.from_file(path).planes:
        if plane.name != want:
            continue
        lines = [line for line in plane.lines if line.name.startswith("Stream")] or list(plane.lines)
        for line in lines:
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" in stats:
                    times[str(stats.get("hlo_module", "")), str(stats["hlo_op"])] += round(event.duration_ns * 1000)
                elif device == "gpu":  # a kernel or copy outside XLA's compiled step
                    times["", event.name] += round(event.duration_ns * 1000)
    return times, want


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = ")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->.*\{\s*$")
_SHAPE = re.compile(r"^[a-z]\w*\[([\d,]*)\]")


def _dimensions(shape):
    found = _SHAPE.match(shape)
    return [int(d) for d in found.group(1).split(",") if d] if found else []


def _closing(text, start):
    """The index after the bracket that closes `text[start]`."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "({[":
            depth += 1
        elif text[i] in ")}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _parse(line, shapes):
    """One HLO text instruction: a dict of its name, shape, opcode, operands, op name, calls and product."""
    found = _INSTRUCTION.match(line)
    name, rest = found.group(1), line[found.end() :]
    end = _closing(rest, 0) if rest.startswith("(") else rest.index(" ")
    shape, rest = rest[:end], rest[end:].lstrip()
    opcode = rest[: rest.index("(")]
    close = _closing(rest, len(opcode))
    operands = re.findall(r"%([\w.\-]+)", rest[len(opcode) : close])
    attributes = rest[close:]
    shapes[name] = shape
    op_name = re.search(r'op_name="([^"]*)"', attributes)
    calls = re.search(r"calls=%?([\w.\-]+)", attributes)
    return {
        "name": name,
        "opcode": opcode,
        "operands": operands,
        "op_name": op_name.group(1) if op_name else "",
        "calls": calls.group(1) if calls else None,
        "product": _product(opcode, operands, attributes, shapes),
    }


def _product(opcode, operands, attributes, shapes):
    """`(contraction size, batched)` of a `dot` or a GEMM custom call (cuBLAS), as `_product_shape`; else None."""
    if opcode == "dot":
        contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attributes)
        batched = "lhs_batch_dims=" in attributes
    elif opcode == "custom-call" and re.search(r'custom_call_target="[^"]*(?:gemm|matmul)', attributes, re.I):
        contracting = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', attributes)
        batch = re.search(r'"lhs_batch_dimensions":\[([^\]]*)\]', attributes)
        batched = bool(batch and batch.group(1).strip())
    else:
        return None
    lhs = _dimensions(shapes.get(operands[0], "")) if operands else []
    axes = [int(a.strip('" ')) for a in contracting.group(1).split(",") if a.strip('" ')] if contracting else []
    if not axes or max(axes) >= len(lhs):
        return None
    size = 1
    for axis in axes:
        size *= lhs[axis]
    return size, batched


def read_modules(dump_dir):
    """`{module name: {computation name: (root name, [instruction dicts])}}` of the dumped optimised HLO."""
    modules = {}
    for path in sorted(glob.glob(os.path.join(dump_dir, "*after_optimizations.txt"))):
        with open(path) as f:
            text = f.read().splitlines()
        module_name = re.match(r"HloModule ([\w.\-]+)", text[0]).group(1)
        computations, current, shapes = {}, None, {}
        for line in text[1:]:
            header = _COMPUTATION.match(line)
            if header:
                current = computations.setdefault(header.group(1), [None, []])
                for parameter, shape in re.findall(r"([\w.\-]+): ([a-z]\w*\[[\d,]*\])", header.group(2)):
                    shapes[parameter] = shape
            elif current is not None and _INSTRUCTION.match(line):
                instruction = _parse(line, shapes)
                current[1].append(instruction)
                if line.lstrip().startswith("ROOT "):
                    current[0] = instruction["name"]
        modules[module_name] = computations  # a module compiled again replaces the first
    return modules


def hlo_instructions(dump_dir):
    """`{(module, instruction): (op name, opcode, product)}`, as `profile_step.xla_instructions` gives for TensorFlow.

    A fusion takes its own op name, else its root's, else its instructions' most common one; an instruction
    without one (a copy XLA added) takes its operands' most common one, else its users'.
    """
    found = {}
    for module, computations in read_modules(dump_dir).items():
        for _, instructions in computations.values():
            own = {}
            for instruction in instructions:
                name = instruction["op_name"]
                if not name and instruction["calls"] in computations:  # a fusion: its root's, or its parts'
                    fused_root, fused = computations[instruction["calls"]]
                    by_name = {i["name"]: i for i in fused}
                    name = by_name[fused_root]["op_name"] if fused_root in by_name else ""
                    name = name or most_common(i["op_name"] for i in fused)
                own[instruction["name"]] = name
            names = op_names(own, {i["name"]: i["operands"] for i in instructions})
            for instruction in instructions:
                product = instruction["product"]
                if product is None and instruction["calls"] in computations:  # a fusion that holds a product
                    product = next((i["product"] for i in computations[instruction["calls"]][1] if i["product"]), None)
                found[module, instruction["name"]] = (names[instruction["name"]], instruction["opcode"], product)
    return found


def peak_temporaries(dump_dir):
    """`(arena bytes, peak bytes, {(module, instruction): bytes})`: the train step's temporaries at their peak.

    XLA gives a compiled step one arena for its temporaries (the buffer assignment's "preallocated-temp"
    allocation), where each intermediate value lives from the instruction that makes it to its last use (the
    live-range dump). The peak is the instruction at which the live values' sizes sum highest; the values are
    named by the instructions that made them. The arena can be larger than the peak (fragmentation); the
    weights, the optimizer's slots and the batch live outside it.
    """
    found = (0, 0, {})
    for path in sorted(glob.glob(os.path.join(dump_dir, "*after_optimizations-buffer-assignment.txt"))):
        module = re.match(r"module_\d+\.(.*?)\.\w+_after_optimizations", os.path.basename(path)).group(1)
        with open(path) as f:
            text = f.read()
        arena = re.search(r"^allocation \d+: size (\d+), preallocated-temp:\n((?: value:.*\n)*)", text, re.M)
        if not arena:
            continue
        sizes = {
            name: int(size) for name, size in re.findall(r"value: <\d+ ([\w.\-]+) @\d+> \(size=(\d+),", arena.group(2))
        }
        with open(path.replace("-buffer-assignment.txt", "-live-range.txt")) as f:
            ranges = re.findall(r"^\s+([\w.\-]+)\{[^}]*\}:(\d+)-(\d+)$", f.read(), re.M)
        changes = collections.Counter()
        spans = [(name, int(start), int(end)) for name, start, end in ranges if name in sizes]
        for name, start, end in spans:
            changes[start] += sizes[name]
            changes[end + 1] -= sizes[name]
        total, peak, peak_at = 0, 0, 0
        for time in sorted(changes):
            total += changes[time]
            if total > peak:
                peak, peak_at = total, time
        live = {(module, name): sizes[name] for name, start, end in spans if start <= peak_at <= end}
        if int(arena.group(1)) > found[0]:  # the step's module (the largest), once compiled
            found = (int(arena.group(1)), peak, live)
    return found
