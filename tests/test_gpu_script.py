"""`benchmarks/gpu/run.sh --quick`: the one prepared GPU command runs end to end on a CPU, so it cannot break unseen.

Its PyTorch side runs where `TORCH_PYTHON` (default `python3`) imports torch, its JAX side where this Python imports
jax; elsewhere the script must say that it skipped them, and still pass. The whole run is tested where jax imports:
CI's JAX stage, which has all three frameworks (in CI's TensorFlow stages it would repeat the TensorFlow side alone,
about five minutes of a stage).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.backend_utils import without_tensorflow

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARTS = {"token mixer kernel", "projections", "feed-forward", "norms", "output head and loss", "optimizer", "rest"}


def _imports(python, modules):
    return subprocess.run([python, "-c", f"import {modules}"], capture_output=True).returncode == 0


def test_the_gpu_script_runs_every_measurement_in_quick_mode(tmp_path):
    pytest.importorskip("jax")
    # The TensorFlow and JAX sides on this Python (each sets its own Keras backend, whatever the caller's).
    env = {**os.environ, "PYTHON": sys.executable, "JAX_PYTHON": sys.executable, "TF_CPP_MIN_LOG_LEVEL": "2"}
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
        (r["architecture"], r["backend"], r["dtype_policy"], "CONDITIONAL,WHILE" in r["xla_flags"])
        for r in rows
        if "architecture" in r
    }
    has_torch = _imports(env.get("TORCH_PYTHON", "python3"), "torch")
    settings = [
        ("tensorflow", "mixed_bfloat16", False),
        ("tensorflow", "float32", True),
        ("jax", "mixed_bfloat16", False),
    ] + [("torch", "mixed_bfloat16", False)] * has_torch  # Keras on PyTorch, eager
    assert steps == {(name, *setting) for name in ("elita", "transformer") for setting in settings}, steps
    keras_steps = [r for r in rows if "architecture" in r]
    assert all(r["jit_compile"] == (r["backend"] != "torch") and r["step_s"] > 0 for r in keras_steps), keras_steps
    # ELiTA's JAX step on one device and data parallel over two (host devices here), in a table of its own.
    assert sorted(r["devices"] for r in keras_steps if r.get("devices")) == [1, 2], keras_steps
    assert "ELiTA's JAX step, data parallel" in summary and "| seed | 2 | 32 | 2 |" in summary, summary

    layers = [r for r in rows if "subject" in r and r.get("framework") != "pytorch"]
    assert {r["subject"] for r in layers} == {"kernel-factored", "kernel-direct", "attention2"}
    assert all(r["dtype_policy"] == "mixed_bfloat16" and r["fwd_bwd_finite"] for r in layers), layers

    profiles = {r["backend"]: r for r in rows if "profile" in r}
    assert set(profiles) == {"tensorflow", "jax"}, profiles
    for profile in profiles.values():
        assert profile["jit_compile"] and profile["plane"] == "/host:CPU" and set(profile["parts"]) == PARTS, profile
        assert profile["op_ms"] > 0 and profile["top"] and profile["mfu"] is None
    assert "Where ELiTA's step goes" in summary

    # The Keras steps' rows at the seed size (two TensorFlow, one JAX, one PyTorch), and the row against the GPT.
    assert summary.count("| seed | 32 | 2 |") == 4 + has_torch, summary
    assert ("| seed | 32 | 2 | torch | mixed_bfloat16 | no |" in summary) == has_torch, summary
    assert "seed, T=32, B=2: ELiTA on JAX / PyTorch GPT step: compiled not measured; JAX / TensorFlow" in summary
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


def test_the_jax_step_and_its_profile_run_without_tensorflow(tmp_path):
    """The JAX side's step and profile, with TensorFlow unimportable: the batches, the model, the trace and the
    HLO names all come without it, and every part of the step gets its share of the time."""
    pytest.importorskip("jax")
    env = without_tensorflow(tmp_path, "jax")
    env.pop("XLA_FLAGS", None)
    toy = ["--num-layers", "1", "--hidden-dim", "32", "--num-heads", "2", "--head-dim", "16"]
    toy += ["--vocabulary-size", "500", "--jit-compile", "--dtype-policy", "mixed_bfloat16"]
    out = tmp_path / "raw.jsonl"
    commands = [
        ["training_step.py", "--architectures", "elita", "--sequence-lengths", "32", "--tokens", "64"]
        + ["--repeats", "1"],
        ["profile_step.py", "--sequence-length", "32", "--batch-size", "2", "--warmup", "1", "--steps", "2"]
        + ["--memory"],
    ]
    for count, command in enumerate(commands, 1):
        proc = subprocess.run(
            [sys.executable, *command, *toy, "--out", str(out)],
            cwd=ROOT / "benchmarks",
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
        # training_step.py measures in a child process and reports a failed one in its table.
        assert proc.returncode == 0 and len(rows) == count, proc.stdout[-3000:] + proc.stderr[-3000:]
    step, profile = rows
    assert step["backend"] == profile["backend"] == "jax" and "tensorflow" not in step
    assert step["step_s"] > 0 and step["jit_compile"] and step["dtype_policy"] == "mixed_bfloat16"
    # Read back from JAX's trace and XLA's HLO dump: each part of ELiTA's step has time, forward and backward.
    parts = profile["parts"]
    for part in PARTS - {"rest"}:
        assert parts[part]["forward_ms"] > 0, (part, parts)
    for part in ("token mixer kernel", "projections", "feed-forward", "norms"):
        assert parts[part]["backward_ms"] > 0, (part, parts)
    total = sum(t["forward_ms"] + t["backward_ms"] for t in parts.values())
    assert parts["rest"]["forward_ms"] + parts["rest"]["backward_ms"] < 0.2 * total, parts
    # XLA's temporaries at their peak, from the buffer assignment and the live ranges it dumps, by part.
    assert profile["peak_tensor_mib"] > 0 and "XLA's temporaries" in profile["peak_counts"], profile
    assert {"token mixer kernel", "feed-forward", "norms"} <= set(profile["peak_by_part"]), profile["peak_by_part"]


def test_the_zoology_recall_grid_runs_on_jax_without_tensorflow(tmp_path):
    """`recall.sh --quick`: elita-recall under Zoology's protocol on JAX, with TensorFlow unimportable (the script
    runs JAX_PYTHON, here a Python whose every import of TensorFlow fails)."""
    pytest.importorskip("jax")
    env = without_tensorflow(tmp_path, "jax")
    python = tmp_path / "python"  # the script sets PYTHONPATH to the repository's: the blocker goes first
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{tmp_path}:$PYTHONPATH" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu/recall.sh"), "--quick", str(out)],
        env={**env, "JAX_PYTHON": str(python)}, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "recall" / "recall.json").read_text())
    assert [r["architecture"] for r in report["best"]] == ["elita", "transformer"]
    for record in report["cells"]:
        assert record["backend"] == "jax" and record["settings"]["protocol"] == "zoology"
        assert (record["steps"], record["batch_size"]) == (4, 32)
    log = (out / "recall.log").read_text()
    assert "wrote" in log and "tensorflow" not in log.lower() and "WARNING" not in log, log
