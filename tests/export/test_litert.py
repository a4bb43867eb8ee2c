"""LiteRT export: prefill/decode signatures, built-in ops only, run by the `ai_edge_litert` interpreter."""

import dataclasses
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import sentencepiece

from elita_tf.cli.export import main as export_main
from elita_tf.cli.train import parse_args
from elita_tf.data.corpus_settings import CorpusSettings
from elita_tf.export import LiteRTModel, export_litert, litert
from elita_tf.export.litert import flatten_state, model_identity, read_identity
from elita_tf.layers.renamed_arguments import RENAMED_ARGUMENTS
from elita_tf.models import ARCHITECTURES, ElitaBackbone, ElitaCausalLM
from elita_tf.training import EvaluateSettings, evaluate, train
from elita_tf.training.checkpoints import load_run_model
from tests.conftest import TINY_RUN, rare_character_lines
from tests.export.test_export import _refused

pytest.importorskip("ai_edge_litert")

PROMPTS = [[5, 9, 14, 3, 7], [2], [11, 4, 4, 20]]
DECODING = sorted(name for name in ARCHITECTURES if name != "elita-reference")


def _greedy(backbone, prompts, new_tokens):
    """Each prompt's `new_tokens` greedy ids through `ElitaCausalLM.generate`."""
    width = max(map(len, prompts)) + new_tokens
    token_ids = np.array([p + [0] * (width - len(p)) for p in prompts], "int32")
    padding_mask = np.array([[i < len(p) for i in range(width)] for p in prompts])
    causal_lm = ElitaCausalLM(backbone)
    causal_lm.compile(sampler="greedy")
    out = causal_lm.generate({"token_ids": token_ids, "padding_mask": padding_mask}, stop_token_ids=None)
    return [list(map(int, row[len(p) : len(p) + new_tokens])) for row, p in zip(out["token_ids"], prompts)]


def _teacher_forced_top1(path, tokens):
    """The file's argmax after each prefix of `tokens`."""
    model = LiteRTModel(path)
    state = model.prefill(token_ids=tokens[None, :1])
    top1 = []
    for token in tokens[1:]:
        top1.append(int(np.argmax(state.pop("logits"))))
        state = model.decode(token_ids=np.array([[token]], np.int32), **state)
    return np.array(top1 + [int(np.argmax(state["logits"]))])


@pytest.fixture(scope="module")
def trained(tiny_wikitext, tmp_path_factory):
    """A small ELiTA trained on the tiny corpus, exported in float and in int8 through `elita-export`."""
    root = tmp_path_factory.mktemp("litert")
    run = root / "run"
    flags = {
        "--vocabulary-size": 60,
        "--sequence-length": 32,
        "--batch-size": 16,
        "--hidden-dim": 64,
        "--num-layers": 2,
    }
    flags.update({"--num-heads": 4, "--head-dim": 16, "--epochs": 20, "--max-steps": 60, "--eval-batches": 2})
    args = ["--data-dir", tiny_wikitext, "--output-dir", str(run), "--tfds-dir", str(run) + "_tfds", "--verbose", "0"]
    results = train(parse_args(args + [str(item) for pair in flags.items() for item in pair]))
    files = {}
    for quantize in [None, "int8"]:
        files[quantize] = str(root / f"elita-{quantize or 'float'}.tflite")
        extra = ["--quantize", quantize] if quantize else []
        assert export_main(["--run-dir", str(run), "--format", "litert", "--output", files[quantize], *extra]) == 0
    return run, results, load_run_model(str(run)).backbone, files


def test_signatures_share_one_state(trained):
    *_, backbone, files = trained
    model = LiteRTModel(files[None])
    state = model.prefill(token_ids=np.array([[3, 4, 5]], np.int32))
    names = sorted(flatten_state(backbone.get_initial_cache(1)))
    assert sorted(state) == sorted(names + ["logits"])
    assert state["logits"].shape == (1, backbone.vocabulary_size) and state["position"].tolist() == [3]
    stepped = model.decode(token_ids=np.array([[6]], np.int32), **{k: v for k, v in state.items() if k != "logits"})
    assert sorted(stepped) == sorted(state) and stepped["position"].tolist() == [4]
    for name in names:
        assert stepped[name].shape == state[name].shape and stepped[name].dtype == state[name].dtype, name


def test_float_file_decodes_the_keras_greedy_tokens_and_its_loss(trained, tiny_wikitext):
    run, results, backbone, files = trained
    model = LiteRTModel(files[None])
    assert [model.generate(prompt, 24) for prompt in PROMPTS] == _greedy(backbone, PROMPTS, 24)
    data = {"data_dir": tiny_wikitext, "tfds_dir": str(run) + "_tfds", "eval_batches": 2}
    scored = evaluate(EvaluateSettings(str(run), litert=files[None], **data))
    assert scored["loss"] == pytest.approx(results["test_loss"], abs=1e-4)
    assert scored["sequences"] == 2 * 16
    # Other text is scored whole through the file too: the same tokens as the Keras model, the same loss.
    text = os.path.join(tiny_wikitext, "wiki.valid.tokens")
    keras_whole = evaluate(EvaluateSettings(str(run), corpus=CorpusSettings(text)))
    litert_whole = evaluate(EvaluateSettings(str(run), corpus=CorpusSettings(text), litert=files[None]))
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(run / "sentencepiece.model"))
    lines = [line.strip() for line in open(text, encoding="utf-8") if line.strip()]
    assert litert_whole["tokens"] == sum(len(pieces.encode(line)) + 1 for line in lines) - 1  # every token but one
    assert litert_whole["tokens"] == keras_whole["tokens"] and litert_whole["sequences"] == keras_whole["sequences"]
    assert litert_whole["loss"] == pytest.approx(keras_whole["loss"], abs=1e-4)


def test_int8_file_is_under_half_the_size_and_agrees_with_keras(trained, tiny_wikitext):
    run, results, backbone, files = trained
    assert os.path.getsize(files["int8"]) <= 0.5 * os.path.getsize(files[None])
    # Free-running greedy text diverges for good at its first different token; the agreement rate is
    # taken teacher-forced instead: the int8 file's next-token argmax against the Keras model's, at every
    # position of held-out text.
    want = [row[0] for row in _greedy(backbone, PROMPTS, 1)]
    assert [LiteRTModel(files["int8"]).generate(prompt, 1)[0] for prompt in PROMPTS] == want
    text = np.array([[2, 5, 9, 14, 3, 7, 11, 4, 4, 20, 6, 3, 4, 10, 12, 33, 25, 15, 9, 10, 3, 8, 7, 6]], np.int32)
    keras_top1 = np.argmax(backbone({"token_ids": text, "padding_mask": np.ones_like(text)}), axis=-1)[0]
    assert np.mean(_teacher_forced_top1(files["int8"], text[0]) == keras_top1) >= 0.9
    assert np.array_equal(_teacher_forced_top1(files[None], text[0]), keras_top1)
    data = {"data_dir": tiny_wikitext, "tfds_dir": str(run) + "_tfds", "eval_batches": 2}
    int8 = evaluate(EvaluateSettings(str(run), litert=files["int8"], **data))["loss"]
    assert int8 == pytest.approx(results["test_loss"], abs=0.05) and int8 != results["test_loss"]


def test_a_byte_fallback_run_scores_rare_characters_through_the_file(tmp_path):
    # 300 pieces, fewer than the text's characters: the rare ones are spelled in byte pieces.
    lines = rare_character_lines(240)
    (tmp_path / "texts").mkdir()
    for i in range(30):
        (tmp_path / "texts" / f"{i}.txt").write_text("\n".join(lines[8 * i : 8 * i + 8]) + "\n")
    size = [value if value != "40" else "300" for value in TINY_RUN]
    args = ["--data", str(tmp_path / "texts" / "*.txt"), "--output-dir", str(tmp_path / "run"), "--max-steps", "2"]
    train(parse_args(args + size))
    path = export_litert(load_run_model(str(tmp_path / "run")), str(tmp_path / "rare.tflite"))
    other = rare_character_lines(10, seed=5) + ["\u0436 \U0001d11e \u2603 new ."]  # and characters never seen
    (tmp_path / "other.txt").write_text("\n".join(other) + "\n")
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "run" / "sentencepiece.model"))
    ids = sum(pieces.encode(other), [])
    assert pieces.get_piece_size() == 300 and pieces.unk_id() not in ids and any(map(pieces.is_byte, ids))
    other_text = EvaluateSettings(str(tmp_path / "run"), corpus=CorpusSettings(str(tmp_path / "other.txt")))
    keras_whole = evaluate(other_text)
    litert_whole = evaluate(dataclasses.replace(other_text, litert=path))
    assert litert_whole["tokens"] == keras_whole["tokens"] == len(ids) + len(other) - 1  # every token but one
    assert litert_whole["loss"] == pytest.approx(keras_whole["loss"], abs=1e-4)


@pytest.mark.parametrize("name", DECODING)
def test_every_architecture_exports_and_decodes_its_greedy_tokens(name, tmp_path):
    # Key/value blocks (transformer, simplified) and 3Lin hold max_sequence_length positions; the rest a fixed state.
    keras.utils.set_random_seed(0)
    size = {"hidden_dim": 16, "num_layers": 2, "num_heads": 2, "head_dim": 8, "max_sequence_length": 48}
    backbone = ElitaBackbone.from_architecture(name, vocabulary_size=50, **size)
    path = export_litert(ElitaCausalLM(backbone), str(tmp_path / f"{name}.tflite"))
    model = LiteRTModel(path)
    assert [model.generate(prompt, 12) for prompt in PROMPTS] == _greedy(backbone, PROMPTS, 12)


@pytest.mark.parametrize("policy_name", ["mixed_bfloat16", "mixed_float16"])
def test_a_mixed_precision_model_exports_in_float32(policy_name, tmp_path):
    keras.utils.set_random_seed(0)
    size = {"hidden_dim": 16, "num_layers": 2, "num_heads": 2, "head_dim": 8, "max_sequence_length": 48}
    backbone = ElitaBackbone.from_architecture("elita", vocabulary_size=50, dtype=policy_name, **size)
    path = export_litert(ElitaCausalLM(backbone), str(tmp_path / "mixed.tflite"))
    float32 = ElitaBackbone.from_architecture("elita", vocabulary_size=50, **size)
    float32.set_weights(backbone.get_weights())
    model = LiteRTModel(path)
    assert [model.generate(prompt, 8) for prompt in PROMPTS] == _greedy(float32, PROMPTS, 8)


def test_bad_requests_are_refused_with_the_value(trained, tmp_path, capsys):
    run, _, backbone, files = trained
    with pytest.raises(ValueError, match="quantize='int4'"):
        export_litert(ElitaCausalLM(backbone), str(tmp_path / "m.tflite"), quantize="int4")
    with pytest.raises(SystemExit):
        export_main(["--run-dir", str(run), "--output", str(tmp_path / "saved"), "--quantize", "int8"])
    assert "--format saved_model" in capsys.readouterr().err
    with pytest.raises(ValueError, match="prompt=\\[\\]"):
        LiteRTModel(files[None]).generate([], 4)
    with pytest.raises(ValueError, match="pass `litert` or `quantize`"):
        evaluate(EvaluateSettings(str(run), litert=files[None], quantize="int8"))


def test_the_file_carries_its_run_and_another_run_s_file_is_refused(trained, tiny_wikitext, tmp_path, monkeypatch):
    run, _, _, files = trained
    causal_lm = load_run_model(str(run))
    assert read_identity(files[None]) == model_identity(causal_lm)
    assert read_identity(files["int8"])["quantize"] == "int8"
    # A file of elita-tf 0.1.0 names the architecture's fields as it did, and is its run's.
    identity = model_identity(causal_lm)
    old_names = {new: old for old, new in RENAMED_ARGUMENTS["ElitaBackbone"].items()}
    identity["architecture"] = {old_names.get(k, k): v for k, v in identity["architecture"].items()}
    assert "tied_embeddings" in identity["architecture"]
    with monkeypatch.context() as patch:
        patch.setattr(litert, "read_identity", lambda path: identity)
        litert.check_identity(files[None], causal_lm)
    # The same architecture and tokenizer, other weights: the report of `elita-evaluate --litert` would be wrong.
    weight = causal_lm.backbone.get_layer("block_0").mixer.k1_dense.kernel
    weight.assign(weight + 0.01)
    other = export_litert(causal_lm, str(tmp_path / "other.tflite"))
    data = {"data_dir": tiny_wikitext, "tfds_dir": str(run) + "_tfds", "eval_batches": 1}
    with pytest.raises(ValueError, match="exported from another model. Received: weights_sha256="):
        evaluate(EvaluateSettings(str(run), litert=other, **data))
    # Another architecture is named field by field.
    backbone = ElitaBackbone.from_architecture("elita", vocabulary_size=60, num_layers=1, hidden_dim=16, head_dim=8)
    small = export_litert(ElitaCausalLM(backbone), str(tmp_path / "small.tflite"))
    with pytest.raises(ValueError, match="num_layers=1 \\(the run's: 2\\)"):
        evaluate(EvaluateSettings(str(run), litert=small, **data))


def test_undefined_next_tokens_are_nan_and_the_runner_refuses_them(trained, tmp_path):
    *_, files = trained
    model = LiteRTModel(files[None])
    assert np.isnan(model.prefill(token_ids=np.zeros([1, 0], np.int32))["logits"]).all()  # an empty prompt
    # A finite buffer (3Lin's wide layers here) read past max_sequence_length.
    keras.utils.set_random_seed(0)
    size = {"hidden_dim": 16, "num_layers": 2, "num_heads": 2, "head_dim": 8, "max_sequence_length": 8}
    backbone = ElitaBackbone.from_architecture("3lin", vocabulary_size=50, **size)
    model = LiteRTModel(export_litert(ElitaCausalLM(backbone), str(tmp_path / "3lin.tflite")))
    state = model.prefill(token_ids=np.arange(1, 9, dtype=np.int32)[None])  # 8 tokens: defined
    assert np.isfinite(state.pop("logits")).all()
    assert np.isnan(model.decode(token_ids=np.array([[3]], np.int32), **state)["logits"]).all()  # the 9th
    assert len(model.generate([1, 2, 3, 4, 5], 4)) == 4  # reads 8 tokens
    with pytest.raises(ValueError, match="past the buffers.*Received: 9 tokens"):
        model.generate([1, 2, 3, 4, 5], 5)


def test_elita_export_in_a_fresh_process_loads_the_run_s_checkpoint(trained, tmp_path):
    # Nothing else imported: the checkpoint's optimizer and schedule classes must register themselves.
    run, *_ = trained
    out = tmp_path / "preset"
    command = [sys.executable, "-m", "elita_tf.cli.export", "--run-dir", str(run), "--format", "preset"]
    done = subprocess.run([*command, "--output", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ElitaCausalLM.from_preset(str(out)).backbone.num_layers == 2


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """A one-layer ELiTA of a 50-token vocabulary as a LiteRT file: the runner's checks need no trained model."""
    keras.utils.set_random_seed(0)
    size = {"hidden_dim": 16, "num_layers": 1, "num_heads": 2, "head_dim": 8, "max_sequence_length": 16}
    backbone = ElitaBackbone.from_architecture("elita", vocabulary_size=50, **size)
    return export_litert(ElitaCausalLM(backbone), str(tmp_path_factory.mktemp("tiny") / "tiny.tflite"))


def test_a_quantized_model_is_refused_in_one_line_that_says_what_to_export(tmp_path):
    backbone = ElitaBackbone.from_architecture("elita", vocabulary_size=50, hidden_dim=16, num_layers=1, head_dim=8)
    backbone.quantize("int8")
    with pytest.raises(ValueError) as error:
        export_litert(ElitaCausalLM(backbone), str(tmp_path / "q.tflite"))
    message = str(error.value)
    assert "\n" not in message and "quantize='int8'" in message and message.endswith("Received: quantization_mode=int8")
    assert not os.path.exists(tmp_path / "q.tflite")


def test_generate_refuses_a_negative_or_fractional_count(tiny_file):
    model = LiteRTModel(tiny_file)
    assert model.generate([1, 2], 0) == [] and len(model.generate([1, 2], np.int64(2))) == 2
    for count in [-1, 2.5, True, "3"]:
        with pytest.raises(ValueError, match=f"Received: max_new_tokens={count!r}"):
            model.generate([1, 2], count)


def test_ids_outside_the_vocabulary_are_named_before_the_interpreter_runs(tiny_file):
    model = LiteRTModel(tiny_file)
    assert model.vocabulary_size == 50
    with pytest.raises(ValueError, match=r"vocabulary_size=50\)\. Received: prompt\[1\]=50$"):
        model.generate([1, 50, 2], 3)
    with pytest.raises(ValueError, match=r"Received: prompt\[0\]=-1$"):
        model.generate([-1, 2], 3)
    with pytest.raises(ValueError, match=r"Received: sequences\[1, 2\]=70$"):
        model.loss([[1, 2, 3], [4, 5, 70]])
    assert np.isfinite(model.loss([[1, 2, 3], [4, 5, 49]])[0])


def test_a_missing_or_damaged_file_is_named(tiny_file, tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "none.tflite")):
        LiteRTModel(str(tmp_path / "none.tflite"))
    content = open(tiny_file, "rb").read()
    for name, cut in [("half", len(content) // 2), ("empty", 0)]:
        path = tmp_path / f"{name}.tflite"
        path.write_bytes(content[:cut])
        with pytest.raises(ValueError, match="is not a complete LiteRT file \\(truncated or damaged\\?\\): ") as error:
            LiteRTModel(str(path))
        assert str(error.value).startswith(str(path)) and "\n" not in str(error.value)


def test_elita_export_writes_only_over_its_own_litert_files(tiny_file, tmp_path, capsys):
    run = str(tmp_path / "no-run")  # refused before the model loads: the run need not exist
    notes = tmp_path / "notes.tflite"
    notes.write_text("not a model")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.txt").write_text("keep me")
    for output in [notes, folder]:
        err = _refused(["--run-dir", run, "--format", "litert", "--output", str(output)], capsys)
        assert err.count("\n") == 1 and f"Received: output={output}" in err, err
    assert notes.read_text() == "not a model" and (folder / "a.txt").read_text() == "keep me"
    earlier = shutil.copy(tiny_file, tmp_path / "earlier.tflite")  # an earlier export: on to loading the run
    assert "is not an elita-train run directory" in _refused(
        ["--run-dir", run, "--format", "litert", "--output", str(earlier)], capsys
    )
