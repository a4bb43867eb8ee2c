"""`benchmarks/gpu/run.sh --quick`: the one prepared GPU command runs end to end on a CPU, so it cannot break unseen.

Its PyTorch side runs where `TORCH_PYTHON` (default `python3`) imports torch; elsewhere (CI) the script must say
that it skipped it, and still pass.
"""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARTS = {"token mixer kernel", "projections", "feed-forward", "norms", "output head and loss", "optimizer", "rest"}


def test_the_gpu_script_runs_every_measurement_in_quick_mode(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu" / "run.sh"), "--quick", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "raw.jsonl").read_text().splitlines()]
    summary = (tmp_path / "summary.md").read_text()

    checks = [r for r in rows if "check" in r]
    assert len(checks) == 10 and all(r["ok"] for r in checks), checks
    assert "checks on /CPU:0: 10 of 10 passed" in summary
    steps = {
        (r["architecture"], r["dtype_policy"], "CONDITIONAL,WHILE" in r["xla_flags"])
        for r in rows
        if "architecture" in r
    }
    assert steps == {
        (name, policy, command_buffers)
        for name in ("elita", "transformer")
        for policy, command_buffers in (("mixed_bfloat16", False), ("float32", True))
    }, steps
    assert all(r["jit_compile"] and r["step_s"] > 0 for r in rows if "architecture" in r)

    layers = [r for r in rows if "subject" in r and r.get("framework") != "pytorch"]
    assert {r["subject"] for r in layers} == {"kernel-factored", "kernel-direct", "attention2"}
    assert all(r["dtype_policy"] == "mixed_bfloat16" and r["fwd_bwd_finite"] for r in layers), layers

    (profile,) = [r for r in rows if "profile" in r]
    assert profile["jit_compile"] and profile["plane"] == "/host:CPU" and set(profile["parts"]) == PARTS, profile
    assert profile["op_ms"] > 0 and profile["top"] and profile["mfu"] is None
    assert "Where ELiTA's step goes" in summary

    torch_python = env.get("TORCH_PYTHON", "python3")
    has_torch = subprocess.run([torch_python, "-c", "import torch"], capture_output=True).returncode == 0
    # Two Keras rows at the seed size, and the PyTorch GPT's where torch imports.
    assert summary.count("| seed | 32 | 2 |") == 2 + has_torch, summary
    if has_torch:
        gpt = {r["torch_gpt"]: r for r in rows if "torch_gpt" in r}
        assert "CUDA" in gpt["compiled"]["skipped"] and gpt["eager"]["step_s"] > 0, gpt
        # The PyTorch GPT is the Keras Transformer layer for layer: the same parameters, to the last bias.
        keras = [r for r in rows if r.get("architecture") == "transformer"]
        assert {r["params"] for r in keras} == {gpt["eager"]["params"]}, (keras, gpt)
        ops = {r["subject"]: r for r in rows if "subject" in r and r.get("framework") == "pytorch"}
        assert ops["sdpa"]["fwd_bwd_ms"] > 0 and ops["sdpa"]["fwd_bwd_finite"] and "CUDA" in ops["fla"]["skipped"]
        assert "seed, T=32, B=2: ELiTA / PyTorch GPT step: compiled skipped (needs CUDA" in summary, summary
        assert "T=64, B=2: attention2 / SDPA causal forward+backward" in summary, summary
        assert "T=64: fla: skipped" in summary
    else:
        assert any(r.get("skipped") == "pytorch" for r in rows)
        assert "PyTorch peer: skipped (torch does not import" in summary
    assert "Issue #48's goals" in summary and summary.count(": not measured") == 5, summary


def test_the_pytorch_side_runs_without_tensorflow():
    """`torch_gpt.py` runs on a lent machine's own Python, which has no TensorFlow: it imports none."""
    code = (
        "import sys; sys.path.insert(0, 'benchmarks/gpu'); import torch_gpt; "
        "assert not {'tensorflow', 'keras', 'torch'} & set(sys.modules), sorted(sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
