"""A PyTorch step's ops, their times and the tensors alive at its memory peak: `profile_step.py`'s PyTorch side.

Keras on PyTorch runs eagerly, one ATen op at a time, and names none of them after its layers. So the step
is traced with `torch.profiler` (`trace`: the ops' times, or with `memory` each allocation and free too) while
`annotate` wraps every layer of the model in a `record_function` range of its path (`block_0/mixer/k1`),
and the loss and the optimizer's update in ranges of their own. The trace is read back from its Chrome
JSON (`read_trace`):

- A forward op belongs to the innermost range around it.
- A backward op runs inside autograd's `evaluate_function: ...Backward` event, whose sequence number is that
  of the forward op that made its node: it belongs to that forward op's range.
- An op's time is its own (self) time: its duration less that of the ops it called.
- An allocation belongs to the op that made it; the tensors alive at the traced steps' highest total are
  listed by that op and its range.
"""

import collections
import json

from measure import alive_at_peak

# Ranges around the parts that are no layer's call (`annotate`).
LOSS_RANGE, OPTIMIZER_RANGE = "token_losses", "optimizer"


def annotate(model):
    """Wraps each layer's call in `model`, its loss and its optimizer's update in `record_function` ranges.

    Returns a function that removes them.
    """
    from torch.profiler import record_function

    handles, open_ranges = [], {}

    def enter(layer, _):
        open_ranges.setdefault(id(layer), []).append(record_function(layer.path).__enter__())

    def leave(layer, _, __):
        open_ranges[id(layer)].pop().__exit__(None, None, None)

    for layer in model._flatten_layers(include_self=False):
        if getattr(layer, "path", None):
            handles.append(layer.register_forward_pre_hook(enter))
            handles.append(layer.register_forward_hook(leave))
    wrapped = [(model.backbone, "token_losses", LOSS_RANGE), (model.optimizer, "apply", OPTIMIZER_RANGE)]
    originals = []
    for owner, name, range_name in wrapped:
        original = getattr(owner, name)
        originals.append((owner, name))

        def in_range(*args, _original=original, _range_name=range_name, **kwargs):
            with record_function(_range_name):
                return _original(*args, **kwargs)

        object.__setattr__(owner, name, in_range)

    def remove():
        for handle in handles:
            handle.remove()
        for owner, name in originals:
            object.__delattr__(owner, name)

    return remove


def trace(step, steps, path, memory=False):
    """Runs `step()` `steps` times under the profiler and writes its Chrome trace to `path`.

    With `memory`, the trace also holds each allocation and free (`profile_memory`), which costs each op time:
    trace the times without it.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=memory) as profiler:
        for _ in range(steps):
            step()
    profiler.export_chrome_trace(path)


def read_trace(path):
    """`(ops, peak bytes, live)` of a Chrome trace written by `trace` from an `annotate`d model.

    `ops`: `[(range, direction, op name, self microseconds)]`, one per ATen op event. `live`: `{(range,
    direction, op name): (bytes, tensors)}` of the allocations alive at the traced steps' highest total of
    allocated bytes, counted from the start of the trace (what was allocated before it is not seen).
    """
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    kept = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    kept += [e for e in events if e.get("name") == "[memory]"]
    kept.sort(key=lambda e: (e["tid"], e["ts"], -e.get("dur", 0)))
    ops, allocations = [], []
    creator = {}  # sequence number: the range of the forward op that made that autograd node (the last to hold it)
    stack = []  # [end, tid, event, range, backward node's sequence number or None, children's microseconds]
    for event in kept:
        while stack and (stack[-1][1] != event["tid"] or stack[-1][0] <= event["ts"]):
            _close(stack.pop(), ops, creator)
        range_name, sequence = (stack[-1][3], stack[-1][4]) if stack else ("", None)
        if event.get("name") == "[memory]":
            made_in = "forward" if sequence is None else "backward"
            owner = (range_name, made_in, stack[-1][2]["name"] if stack else "")
            allocations.append((event["ts"], event["args"]["Bytes"], event["args"]["Addr"], owner))
            continue
        if stack:
            stack[-1][5] += event["dur"]
        if event["cat"] == "user_annotation":
            range_name = event["name"]
        elif event["name"].startswith("autograd::engine::evaluate_function:"):
            sequence = event["args"].get("Sequence number", -1)
            range_name = creator.get(sequence, range_name)
        stack.append([event["ts"] + event["dur"], event["tid"], event, range_name, sequence, 0.0])
    while stack:
        _close(stack.pop(), ops, creator)
    return (ops, *_peak(allocations))


def _close(entry, ops, creator):
    """Records a finished span of `read_trace`'s walk: an ATen op's self time, and a forward op's node."""
    _, _, event, range_name, sequence, children = entry
    if event["cat"] != "cpu_op":
        return
    ops.append((range_name, "forward" if sequence is None else "backward", event["name"], event["dur"] - children))
    number = event["args"].get("Sequence number", -1)
    if sequence is None and number >= 0:
        creator[number] = range_name


def _peak(allocations):
    """`(peak bytes, live)` of `read_trace` from `[(microseconds, bytes, address, owner)]`, + allocated, - freed."""
    allocations.sort(key=lambda a: a[0])
    peak, live = alive_at_peak([(address, size, owner) for _, size, address, owner in allocations])
    found = collections.defaultdict(lambda: [0, 0])
    for size, owner in live:
        found[owner][0] += size
        found[owner][1] += 1
    return peak, {owner: tuple(value) for owner, value in found.items()}
