"""A run written by elita-tf 0.1.0, before the backbone took keras-hub's names, loads with today's code.

`tests/fixtures/run-0.1.0/` is a finished `elita-train` run of `additive-reference` (tied embeddings,
its own epsilon and windows: the renamed fields) on its own text, with the preset's logits on fixed
ids (`expected.json`).
"""

import json
import os
import shutil
import subprocess
import sys

import keras_hub
import numpy as np
import pytest

from elita_tf.export.litert import model_identity
from elita_tf.models import ElitaBackbone, ElitaCausalLM
from elita_tf.models.architectures import upgrade_config
from elita_tf.training import EvaluateSettings, evaluate
from elita_tf.training.checkpoints import load_run_model
from elita_tf.training.run_directory import read_manifest
from elita_tf.training.run_files import preset_of

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "run-0.1.0")


@pytest.fixture
def old_run(tmp_path, monkeypatch):
    """A copy of the old run, in a working directory where its relative `--data` names its texts."""
    shutil.copytree(FIXTURE, tmp_path / "old")
    monkeypatch.chdir(tmp_path / "old")
    with open("expected.json") as f:
        return "run", json.load(f)


def _logits(causal_lm, ids):
    ids = np.asarray(ids, "int32")
    return np.asarray(causal_lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))


def test_the_old_names_are_upgraded_in_one_place():
    with open(os.path.join(FIXTURE, "run", "preset", "config.json")) as f:
        old = json.load(f)["config"]
    assert {"norm_epsilon", "tied_embeddings", "windows"} <= set(old)
    new = upgrade_config(old)
    assert (
        new["layer_norm_epsilon"] == 1e-5 and new["tie_word_embeddings"] is True and new["sliding_window_sizes"] is None
    )
    assert not {"norm_epsilon", "tied_embeddings", "windows"} & set(new)
    assert upgrade_config(new) == new


LOAD_LAYERS = """
import json, sys, keras, numpy as np
from elita_tf.layers import DecoderBlock, FeedForward2, TriLinearAttention  # the model's outermost classes
model = keras.saving.load_model(sys.argv[1] + "/layers.keras")
with open(sys.argv[1] + "/expected.json") as f:
    expected = json.load(f)
np.testing.assert_allclose(model(np.asarray(expected["inputs"], "float32")), expected["outputs"], rtol=1e-6, atol=1e-6)
ffn2, block, additive_block, three_lin = model.layers[1:]
print(json.dumps([
    type(ffn2).__name__, ffn2.intermediate_dim, block.layer_norm_epsilon, additive_block.mixer.sliding_window_size,
    type(additive_block.ffn).__name__, additive_block.ffn.intermediate_dim, additive_block.ffn.shared_by,
    three_lin.sliding_window_size,
]))
"""


def test_a_keras_file_of_old_layer_arguments_loads_with_its_outputs():
    # A fresh process: the layers' modules load lazily, so only the classes imported above are registered.
    folder = os.path.join(os.path.dirname(FIXTURE), "layers-0.1.0")
    done = subprocess.run([sys.executable, "-c", LOAD_LAYERS, folder], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    # The old arguments in today's names (`WideFeedForward` is `FeedForward`).
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["FeedForward2", 12, 1e-3, 4, "FeedForward", 24, 2, 4]


def test_an_old_preset_loads_through_every_entry_point_with_its_logits(old_run):
    run, expected = old_run
    want = np.asarray(expected["logits"])
    for causal_lm in (
        ElitaCausalLM.from_preset(preset_of(run)),
        keras_hub.models.CausalLM.from_preset(os.path.join(run, "preset")),
    ):
        assert causal_lm.backbone.tie_word_embeddings and causal_lm.backbone.layer_norm_epsilon == 1e-5
        np.testing.assert_allclose(_logits(causal_lm, expected["token_ids"]), want, rtol=1e-6, atol=1e-6)
    backbone = ElitaBackbone.from_preset(preset_of(run))
    assert "tie_word_embeddings" in backbone.get_config() and "tied_embeddings" not in backbone.get_config()


def test_an_old_run_directory_loads_for_export_and_evaluates_as_it_trained(old_run):
    run, expected = old_run
    # Its checkpoint (what elita-export reads) and its manifest, in today's names.
    checkpointed = load_run_model(run)
    np.testing.assert_allclose(_logits(checkpointed, expected["token_ids"]), expected["logits"], rtol=1e-5, atol=1e-5)
    manifest = read_manifest(run)
    assert manifest["model"]["tie_word_embeddings"] and manifest["data"]["corpus"]["document_separator"] == "file"
    assert model_identity(checkpointed)["architecture"]["tie_word_embeddings"]
    # elita-evaluate reads the run's own held-out text again by its recorded settings.
    result = evaluate(EvaluateSettings(run, split="validation"))
    with open(os.path.join(run, "results.json")) as f:
        assert result["loss"] == pytest.approx(json.load(f)["validation_loss"], rel=1e-5)  # what training measured
    with pytest.warns(FutureWarning, match="result key 'windows' is deprecated: use 'sequences'"):
        assert result["windows"] == result["sequences"] > 0  # 0.1.0's key


def test_an_old_run_resumes_where_it_stopped(old_run, capsys):
    # Its data hash covers its corpus settings under their old names: the same text must still match.
    from elita_tf.cli.train import main as train_main
    from elita_tf.training import list_checkpoints

    run, expected = old_run
    arguments = list(expected["arguments"])
    arguments[arguments.index("--max-steps") + 1] = "3"
    text = open("texts/doc-000.txt").read()
    with open("texts/doc-000.txt", "a") as f:
        f.write("another line .\n")
    assert train_main(arguments) == 2 and "data.sha256" in capsys.readouterr().err  # other text is still refused
    with open("texts/doc-000.txt", "w") as f:
        f.write(text)
    assert train_main(arguments) == 0, capsys.readouterr().err
    assert "Resuming additive-reference from step 2" in capsys.readouterr().out
    assert [step for step, _ in list_checkpoints(run)] == [3]
    with open(os.path.join(run, "results.json")) as f:
        assert json.load(f)["steps"] == 3
    assert read_manifest(run, upgrade=False)["data"]["corpus"]["documents"] == "file"  # run.json stays as written
