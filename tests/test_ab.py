"""`benchmarks/ab.py --base HEAD`: this checkout against its own commit, at toy sizes, through the whole tool."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOY = ["--architectures", "elita", "--size", "seed", "--num-layers", "1", "--vocabulary-size", "64"]


def worktrees():
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list", "--porcelain"], capture_output=True, text=True
    )
    return [line.split(" ", 1)[1] for line in listing.stdout.splitlines() if line.startswith("worktree ")]


@pytest.fixture(autouse=True)
def scratch(tmp_path):
    """ab.py's temporary folder (its `TMPDIR`): afterwards no worktree lies in it, and it is empty."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("needs a git checkout")
    yield tmp_path
    assert not [path for path in worktrees() if path.startswith(str(tmp_path))], worktrees()
    assert not list(tmp_path.glob("elita-ab-*"))  # also after an error


def ab(tmp_path, *args, base="HEAD"):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "ab.py"), "--base", base, *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "subject, metrics",
    [
        (["step", "--batch-size", "2", "--sequence-length", "16", *TOY], {"step_s", "loss"}),
        (["kernel", "--shape", "1", "2", "64", "8", "--repeats", "3"], {"fwd_s", "fwd_bwd_s", "fwd_per_elementwise"}),
        (
            ["first-step", "--no-jit-compile", "--sequence-length", "16", "--tokens", "32", "--repeats", "1", *TOY],
            {"first_step_s", "step_s", "peak_mib", "loss"},
        ),
    ],
    ids=["step", "kernel", "first-step"],
)
def test_head_against_head(scratch, subject, metrics):
    rounds = 1 if subject[0] == "first-step" else 3  # first-step: two processes a round
    proc = ab(scratch, *subject, "--rounds", str(rounds))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    table = [line for line in lines if line.startswith("|")]

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    assert {r["metric"] for r in rows} == metrics and len(rows) == len(metrics)
    assert all(r["subject"] == subject[0] and r["rounds"] == rounds and r["base_ref"] == "HEAD" for r in rows), rows
    assert all(r["base_commit"] == head.stdout.strip() and r["this_commit"].startswith(r["base_commit"]) for r in rows)
    assert len(table) == 2 + len(rows) and table[0].startswith("| subject | label | metric | this | base |")
    for r, line in zip(rows, table[2:]):  # the table is the JSON lines', row for row
        assert r["ratio_min"] <= r["ratio_median"] <= r["ratio_max"], r
        assert r["this"] > 0 and r["base"] > 0, r
        cells = [r["subject"], str(r["label"]), r["metric"], f"{r['this']:.4g}", f"{r['base']:.4g}"]
        assert line.startswith("| " + " | ".join(cells) + " |") and f"{r['ratio_median']:.3f}x (" in line, (line, r)
    # The same code on both sides, with the same weights and batch: the same loss, exactly. Times are not
    # checked: how fast each side runs depends on what else the machine runs (the benchmarks' business).
    if "loss" in metrics:
        loss = next(r for r in rows if r["metric"] == "loss")
        assert loss["ratio_min"] == loss["ratio_max"] == 1.0, loss


def test_an_error_removes_the_worktree(scratch):
    proc = ab(scratch, "step", "--architectures", "no-such-architecture", "--rounds", "1")
    assert proc.returncode != 0 and "no-such-architecture" in proc.stderr, proc.stderr[-3000:]


def test_bad_arguments_are_refused_before_a_worktree_is_made(scratch):
    proc = ab(scratch, "kernel", "--rounds", "1", base="no-such-ref")
    assert proc.returncode != 0 and "no-such-ref" in proc.stderr, proc.stderr[-3000:]
    proc = ab(scratch, "step", "--hidden-dim", "8")  # only `train` passes flags on (to elita-train)
    assert proc.returncode == 2 and "unrecognized arguments: --hidden-dim 8" in proc.stderr, proc.stderr
    proc = ab(scratch, "step", "--rounds", "0")
    assert proc.returncode == 2 and "Received: 0" in proc.stderr, proc.stderr
