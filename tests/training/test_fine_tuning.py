"""Fine-tuning: LoRA resumes exactly and an adapted preset loads and trains as saved; bad starting points refused."""

import json
import os
import shutil

import keras
import numpy as np
import pytest

from elita_tf.cli.train import main as train_main
from elita_tf.models import ElitaCausalLM
from elita_tf.training import load_latest_checkpoint, preset_of
from tests.conftest import TINY_RUN, write_documents


def _train(out, *flags):
    return train_main(["--output-dir", str(out), *TINY_RUN, *flags])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A finished run to fine-tune, and new text."""
    root = tmp_path_factory.mktemp("fine-tuning")
    glob = write_documents(root / "texts", 30, seed=0)
    assert _train(root / "base", "--data", glob, "--holdout-fraction", "0.2", "--max-steps", "2") == 0
    return root, write_documents(root / "new", 30, seed=3)


def _adapters(model):
    return {w.path: w.numpy() for w in model.weights if "lora_kernel" in w.path}


def test_a_lora_run_resumes_exactly_and_its_checkpoints_keep_their_adapters(base, tmp_path):
    root, new = base
    lora = ["--init-from", str(root / "base"), "--data", new, "--holdout-fraction", "0.2", "--lora-rank", "2"]
    lora += ["--checkpoint-every", "2"]
    assert _train(tmp_path / "whole", *lora, "--max-steps", "6") == 0
    assert _train(tmp_path / "split", *lora, "--max-steps", "3") == 0
    # The checkpoint of step 3 reloads with the adapters it trained, not zeros.
    reloaded, _ = load_latest_checkpoint(str(tmp_path / "split"))
    adapters = _adapters(reloaded)
    assert adapters and all(np.abs(a).max() > 0 for a in adapters.values())
    assert _train(tmp_path / "split", *lora, "--max-steps", "6") == 0
    a, _ = load_latest_checkpoint(str(tmp_path / "whole"))
    b, _ = load_latest_checkpoint(str(tmp_path / "split"))
    for wa, wb in zip(a.weights + a.optimizer.variables, b.weights + b.optimizer.variables, strict=True):
        np.testing.assert_array_equal(wa.numpy(), wb.numpy(), err_msg=wa.path)
    whole = json.loads((tmp_path / "whole" / "results.json").read_text())
    split = json.loads((tmp_path / "split" / "results.json").read_text())
    assert whole["validation_loss"] == split["validation_loss"]


def test_an_adapted_preset_loads_generates_and_trains_as_saved(base, tmp_path):
    root, new = base
    flags = ["--init-from", str(root / "base"), "--data", new, "--holdout-fraction", "0.2", "--lora-rank", "2"]
    assert _train(tmp_path / "tuned", *flags, "--max-steps", "3") == 0
    trained, _ = load_latest_checkpoint(str(tmp_path / "tuned"))
    causal_lm = ElitaCausalLM.from_preset(preset_of(str(tmp_path / "tuned")))
    assert causal_lm.backbone.lora_rank == 2
    for path, value in _adapters(trained.backbone).items():
        np.testing.assert_array_equal(_adapters(causal_lm.backbone)[path], value)
    ids = np.array([[3, 5, 9, 14, 3, 7]], "int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    np.testing.assert_array_equal(causal_lm(x), trained(x))
    # The loaded preset generates, greedily, what the trained model generates.
    other = ElitaCausalLM(trained.backbone, causal_lm.preprocessor)
    for model in (causal_lm, other):
        model.compile(sampler="greedy")
    # Room for 3 new tokens whatever the pieces the tiny vocabulary cuts the prompt into (they differ by version).
    max_length = len(causal_lm.preprocessor.tokenizer("the king")) + 1 + 3
    generated = causal_lm.generate("the king", max_length=max_length)
    assert generated == other.generate("the king", max_length=max_length) and len(generated) > len("the king")
    # Trained further, the adapters move.
    before = _adapters(causal_lm.backbone)
    causal_lm.compile(optimizer=keras.optimizers.Adam(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(True))
    causal_lm.fit(["the cat sees the dog near the house ."] * 4, batch_size=2, epochs=2, verbose=0)
    assert all(np.abs(_adapters(causal_lm.backbone)[p] - v).max() > 0 for p, v in before.items())


@pytest.mark.parametrize("flag, inside", [("--init-from", ""), ("--tokenizer-from", ""), ("--init-from", "preset")])
def test_a_run_that_would_replace_its_own_source_is_refused_untouched(base, tmp_path, capsys, flag, inside):
    # --force-new, the advice of the refusal to resume, used to delete the source before reading it.
    root, new = base
    run = tmp_path / "run"
    shutil.copytree(root / "base", run)
    before = sorted(str(path.relative_to(run)) for path in run.rglob("*"))
    source = os.path.join(run, inside)
    assert _train(run, flag, source, "--data", new, "--holdout-fraction", "0.2", "--force-new") == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and f"{flag} {source} lies in --output-dir {run}" in error, error
    assert sorted(str(path.relative_to(run)) for path in run.rglob("*")) == before


def test_a_lora_rank_no_projection_can_use_is_refused_before_any_write(base, tmp_path, capsys):
    root, new = base
    out = tmp_path / "tuned"
    assert _train(out, "--init-from", str(root / "base"), "--data", new, "--lora-rank", "100000") == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("elita-train: error: A LoRA rank past every adapted projection's narrower side")
    assert "at most 16" in error and "Received: rank=100000" in error and len(error.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize(
    "config, message",
    [
        ({"class_name": "GPT2Backbone", "config": {"vocabulary_size": 50257}}, r"its backbone is GPT2Backbone"),
        ({}, r"its backbone is not named"),
        (
            {"class_name": "ElitaBackbone", "registered_name": "elita_tf>ElitaBackbone", "config": {"num_layers": 1}},
            r"lacks the architecture fields \['vocabulary_size', 'num_heads'",
        ),
        ("{not json", r"config.json is not JSON"),
    ],
    ids=["gpt2", "empty", "missing-key", "not-json"],
)
def test_a_preset_that_is_not_an_elita_model_is_one_line(base, tmp_path, capsys, config, message):
    root, new = base
    preset = tmp_path / "preset"
    preset.mkdir()
    (preset / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    (preset / "model.weights.h5").write_bytes(b"")
    with pytest.raises(SystemExit) as stop:
        _train(tmp_path / "tuned", "--init-from", str(preset), "--data", new)
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(error.splitlines()) == 1, error
    assert error.startswith("elita-train: error: ") and __import__("re").search(message, error), error
    assert not os.path.exists(tmp_path / "tuned")
