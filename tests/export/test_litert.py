"""LiteRT export: prefill/decode signatures, built-in ops only, run by the `ai_edge_litert` interpreter."""

import json
import os

import keras
import numpy as np
import pytest

from elita_tf.cli.export import main as export_main
from elita_tf.cli.train import parse_args
from elita_tf.generation import Generator, empty_caches
from elita_tf.litert import (
    export_litert,
    flatten_state,
    litert_generate,
    litert_signatures,
)
from elita_tf.models import PRESETS, build_decoder, preset
from elita_tf.models.config import DecoderConfig
from elita_tf.training import latest_checkpoint, train
from elita_tf.training.evaluate import evaluate

pytest.importorskip("ai_edge_litert")

PROMPTS = [[5, 9, 14, 3, 7], [2], [11, 4, 4, 20]]


def _teacher_forced_top1(path, tokens):
    """The file's argmax after each prefix of `tokens`."""
    prefill, decode = litert_signatures(path)
    state = prefill(token_ids=tokens[None, :1])
    top1 = []
    for token in tokens[1:]:
        top1.append(int(np.argmax(state.pop("logits"))))
        state = decode(token_ids=np.array([[token]], np.int32), **state)
    return np.array(top1 + [int(np.argmax(state["logits"]))])


@pytest.fixture(scope="module")
def trained(tiny_wikitext, tmp_path_factory):
    """A small ELiTA trained on the tiny corpus, exported in float and in int8 through `elita-export`."""
    root = tmp_path_factory.mktemp("litert")
    run = root / "run"
    flags = {"--vocabulary-size": 60, "--sequence-length": 32, "--batch-size": 16, "--hidden-dim": 64, "--num-layers": 2}
    flags.update({"--num-heads": 4, "--head-dim": 16, "--epochs": 20, "--max-steps": 60, "--eval-batches": 2})
    args = ["--data-dir", tiny_wikitext, "--output-dir", str(run), "--verbose", "0"]
    results = train(parse_args(args + [str(item) for pair in flags.items() for item in pair]))
    files = {}
    for quantize in [None, "int8"]:
        files[quantize] = str(root / f"elita-{quantize or 'float'}.tflite")
        extra = ["--quantize", quantize] if quantize else []
        assert export_main(["--run-dir", str(run), "--format", "litert", "--output", files[quantize], *extra]) == 0
    model = keras.models.load_model(latest_checkpoint(run), compile=False)
    with open(run / "run.json") as f:
        config = DecoderConfig.from_config(json.load(f)["model"])
    return run, results, model, config, files


def test_signatures_share_one_state(trained):
    *_, model, config, files = trained
    prefill, decode = litert_signatures(files[None])
    state = prefill(token_ids=np.array([[3, 4, 5]], np.int32))
    names = sorted(flatten_state(empty_caches(config, {layer.name: layer for layer in model.layers}, 1)))
    assert sorted(state) == sorted(names + ["logits"])
    assert state["logits"].shape == (1, config.vocab_size) and state["position"].tolist() == [3]
    stepped = decode(token_ids=np.array([[6]], np.int32), **{k: v for k, v in state.items() if k != "logits"})
    assert sorted(stepped) == sorted(state) and stepped["position"].tolist() == [4]
    for name in names:
        assert stepped[name].shape == state[name].shape and stepped[name].dtype == state[name].dtype, name


def test_float_file_decodes_the_keras_greedy_tokens_and_its_loss(trained, tiny_wikitext):
    run, results, model, config, files = trained
    want = Generator(model, config)(PROMPTS, 24).numpy().tolist()
    assert [litert_generate(files[None], prompt, 24) for prompt in PROMPTS] == want
    data = {"data_dir": tiny_wikitext, "tfds_dir": str(run) + "_tfds", "eval_batches": 2}
    scored = evaluate(str(run), litert=files[None], **data)
    assert scored["loss"] == pytest.approx(results["test_loss"], abs=1e-4)
    assert scored["windows"] == 2 * 16


def test_int8_file_is_under_half_the_size_and_agrees_with_keras(trained, tiny_wikitext):
    run, results, model, config, files = trained
    assert os.path.getsize(files["int8"]) <= 0.5 * os.path.getsize(files[None])
    # Free-running greedy text diverges for good at its first different token; the agreement rate is
    # taken teacher-forced instead: the int8 file's next-token argmax against the Keras model's, at every
    # position of held-out text.
    want = Generator(model, config)(PROMPTS, 8).numpy()
    assert [litert_generate(files["int8"], prompt, 1)[0] for prompt in PROMPTS] == want[:, 0].tolist()
    text = np.array([[2, 5, 9, 14, 3, 7, 11, 4, 4, 20, 6, 3, 4, 10, 12, 33, 25, 15, 9, 10, 3, 8, 7, 6]], np.int32)
    keras_top1 = np.argmax(model(text), axis=-1)[0]
    assert np.mean(_teacher_forced_top1(files["int8"], text[0]) == keras_top1) >= 0.9
    assert np.array_equal(_teacher_forced_top1(files[None], text[0]), keras_top1)
    data = {"data_dir": tiny_wikitext, "tfds_dir": str(run) + "_tfds", "eval_batches": 2}
    int8 = evaluate(str(run), litert=files["int8"], **data)["loss"]
    assert int8 == pytest.approx(results["test_loss"], abs=0.05) and int8 != results["test_loss"]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_exports_and_decodes_its_greedy_tokens(name, tmp_path):
    # Key/value blocks (transformer, simplified) and 3Lin hold max_sequence_length positions; the rest a fixed state.
    keras.utils.set_random_seed(0)
    config = preset(name, vocab_size=50, width=16, num_layers=2, num_heads=2, head_dim=8, window_length=48)
    model = build_decoder(config)
    path = export_litert(model, config, str(tmp_path / f"{name}.tflite"))
    want = Generator(model, config)(PROMPTS, 12).numpy().tolist()
    assert [litert_generate(path, prompt, 12) for prompt in PROMPTS] == want


def test_bad_requests_are_refused_with_the_value(trained, tmp_path, capsys):
    run, _, model, config, files = trained
    with pytest.raises(ValueError, match="quantize='int4'"):
        export_litert(model, config, str(tmp_path / "m.tflite"), quantize="int4")
    with pytest.raises(SystemExit):
        export_main(["--run-dir", str(run), "--output", str(tmp_path / "saved"), "--quantize", "int8"])
    assert "--format saved_model" in capsys.readouterr().err
    with pytest.raises(ValueError, match="prompt=\\[\\]"):
        litert_generate(files[None], [], 4)
    with pytest.raises(ValueError, match="pass `litert` or `quantize`"):
        evaluate(str(run), litert=files[None], quantize="int8")
