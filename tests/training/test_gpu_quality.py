"""`training/gpu_quality.sh --quick`: the 25M quality comparison's one prepared command, run at a toy size on the CPU."""

import json
import os
import pathlib
import subprocess
import sys

from tests.conftest import write_tiny_wikitext

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_quality_command_trains_both_models_and_its_budget_cuts_seeds_not_models(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.update(
        ELITA_WIKITEXT_DIR=write_tiny_wikitext(str(tmp_path / "wikitext")),
        ELITA_GPU_BUDGET_S="1",
        ELITA_VOCABULARY_SIZE="60",
    )
    out = tmp_path / "quality"
    done = subprocess.run(
        ["bash", str(ROOT / "training" / "gpu_quality.sh"), "--quick", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Past the budget from the start: every model's first seed still trains, the later seeds are skipped.
    assert "elita, seed 1: skipped" in done.stdout and "transformer, seed 2: skipped" in done.stdout
    table = (out / "results.md").read_text()
    assert "| elita | 0 |" in table and "| transformer | 0 |" in table and "step time (s)" in table
    summary = json.loads((out / "results.json").read_text())
    assert sorted(summary) == ["elita", "transformer"] and os.path.getsize(out / "ELiTA.png") > 10_000
    # Every run read the one tokenizer, and trained the same schedule in mixed bfloat16.
    tokenizer = (out / "tokenizer" / "sentencepiece.model").read_bytes()
    for name in ("elita", "transformer"):
        run = out / name / "seed-0"
        assert (run / "sentencepiece.model").read_bytes() == tokenizer
        settings = json.loads((run / "results.json").read_text())["config"]["settings"]
        assert settings["dtype_policy"] == "mixed_bfloat16" and settings["sequence_length"] == 32
