"""`benchmarks/profile_step.py` on PyTorch: where each op's time and memory go, read back from `torch.profiler`.

The trace reader is tested on a trace written here, whose answer is known; the whole profile runs in PyTorch's CI
stage (the other stages have no torch).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch_profile  # noqa: E402

PARTS = {"token mixer kernel", "projections", "feed-forward", "norms", "output head and loss", "optimizer", "rest"}


def _op(name, ts, dur, sequence=-1, cat="cpu_op", tid=1):
    args = {"Sequence number": sequence}
    return {"ph": "X", "cat": cat, "name": name, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _memory(ts, size, address, tid=1):
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "tid": tid, "ts": ts,
            "args": {"Bytes": size, "Addr": address}}  # fmt: skip


def test_a_backward_op_belongs_to_the_layer_of_the_forward_op_that_made_its_node(tmp_path):
    """Two layers' forward ops, then the backward pass in reverse: each backward op is counted in the range of the
    forward op with its node's sequence number, each op by its own time, and the tensors alive at the peak by the
    op that allocated them."""
    events = [
        _op("block_0/mixer", 0, 100, cat="user_annotation"),
        _op("aten::mm", 10, 50, sequence=7),
        _op("aten::empty", 12, 5),  # inside mm: mm's own time is 45
        _memory(13, 1000, 0xA),  # kept for the backward pass
        _op("block_0/ffn", 100, 100, cat="user_annotation"),
        _op("aten::mul", 110, 20, sequence=8),
        _memory(111, 500, 0xB),
        _memory(112, 300, 0xC),
        _memory(113, -300, 0xC),  # freed at once: not alive at the peak
        # The backward pass: mul's node first, then mm's.
        _op("autograd::engine::evaluate_function: MulBackward0", 300, 30, sequence=8),
        _op("aten::mul", 305, 20),
        _memory(306, 2000, 0xD),  # the peak: 1000 + 500 + 2000
        _op("autograd::engine::evaluate_function: MmBackward0", 400, 60, sequence=7),
        _op("aten::mm", 405, 40),
        _memory(406, -2000, 0xD),
        _memory(407, -1000, 0xA),
        _op("optimizer", 500, 10, cat="user_annotation"),
        _op("aten::_foreach_add_", 501, 8),
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    ops, peak, live = torch_profile.read_trace(str(path))

    own = {}
    for range_name, direction, op, us in ops:
        own[range_name, direction, op] = own.get((range_name, direction, op), 0) + us
    assert own == {
        ("block_0/mixer", "forward", "aten::mm"): 45,
        ("block_0/mixer", "forward", "aten::empty"): 5,
        ("block_0/ffn", "forward", "aten::mul"): 20,
        ("block_0/ffn", "backward", "autograd::engine::evaluate_function: MulBackward0"): 10,
        ("block_0/ffn", "backward", "aten::mul"): 20,
        ("block_0/mixer", "backward", "autograd::engine::evaluate_function: MmBackward0"): 20,
        ("block_0/mixer", "backward", "aten::mm"): 40,
        ("optimizer", "forward", "aten::_foreach_add_"): 8,
    }
    assert peak == 3500
    assert live == {
        ("block_0/mixer", "forward", "aten::empty"): (1000, 1),
        ("block_0/ffn", "forward", "aten::mul"): (500, 1),
        ("block_0/ffn", "backward", "aten::mul"): (2000, 1),
    }


def test_the_pytorch_step_profile_gives_every_part_its_time_and_its_memory(tmp_path):
    """The whole profile of ELiTA's eager PyTorch step: every part has time (the layers' forward and backward), and
    the peak's tensors are told by part."""
    pytest.importorskip("torch")
    out = tmp_path / "raw.jsonl"
    toy = ["--num-layers", "1", "--hidden-dim", "32", "--num-heads", "2", "--head-dim", "16"]
    toy += ["--vocabulary-size", "500", "--sequence-length", "32", "--batch-size", "4", "--warmup", "1", "--steps", "2"]
    proc = subprocess.run(
        [sys.executable, "profile_step.py", *toy, "--memory", "--out", str(out)],
        cwd=ROOT / "benchmarks",
        env={**os.environ, "KERAS_BACKEND": "torch", "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    (profile,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert profile["backend"] == "torch" and not profile["jit_compile"], profile
    parts = profile["parts"]
    assert set(parts) == PARTS, parts
    for part in PARTS - {"rest"}:
        assert parts[part]["forward_ms"] > 0, (part, parts)
    for part in ("token mixer kernel", "projections", "feed-forward", "norms", "output head and loss"):
        assert parts[part]["backward_ms"] > 0, (part, parts)
    total = sum(t["forward_ms"] + t["backward_ms"] for t in parts.values())
    # About 1% here alone; an op's own time is its wall time, so on a loaded machine one preempted op outside the
    # layers can take a third of a toy step. Without the ranges every op would be "rest".
    assert parts["rest"]["forward_ms"] + parts["rest"]["backward_ms"] < 0.5 * total, parts
    # The tensors alive at the peak: what the forward pass keeps for the backward pass, by part.
    assert profile["peak_tensor_mib"] > 0
    assert {"token mixer kernel", "feed-forward", "norms"} <= set(profile["peak_by_part"]), profile["peak_by_part"]
    assert "| part | forward ms | backward ms | share of op time |" in proc.stdout
