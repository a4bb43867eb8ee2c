"""`benchmarks/gpu/run.sh --quick`: the one prepared GPU command runs end to end on a CPU, so it cannot break unseen."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


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

    checks = [r for r in rows if "check" in r]
    assert len(checks) == 10 and all(r["ok"] for r in checks), checks
    steps = {
        (r["architecture"], r["dtype_policy"], "CONDITIONAL,WHILE" in r["xla_flags"]) for r in rows if "step_s" in r
    }
    assert steps == {
        (name, policy, command_buffers)
        for name in ("elita", "transformer")
        for policy, command_buffers in (("mixed_bfloat16", False), ("float32", True))
    }, steps
    assert all(r["jit_compile"] and r["step_s"] > 0 for r in rows if "step_s" in r)
    assert {r["subject"] for r in rows if "subject" in r} == {"kernel", "attention2", "mha"}

    summary = (tmp_path / "summary.md").read_text()
    assert "checks on /CPU:0: 10 of 10 passed" in summary
    assert summary.count("| seed | 32 | 2 |") == 2 and "Attention2 / MultiHeadAttention" in summary, summary
