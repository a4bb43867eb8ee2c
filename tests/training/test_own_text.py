"""A user's own text through the command lines: train, evaluate, generate; and bad input refused before any write."""

import glob
import json
import os
import re

import numpy as np
import pytest
import sentencepiece

from elita_tf.cli.evaluate import main as evaluate_main
from elita_tf.cli.train import main as train_main
from elita_tf.models import ElitaCausalLM
from elita_tf.training import preset_of
from tests.conftest import TINY_RUN, WORDS, write_documents
from tests.data.test_corpus import TinyText

SIZE = [*TINY_RUN, "--max-steps", "3"]


def _train(out, *data):
    return train_main(["--output-dir", str(out), *SIZE, *data])


def test_byte_fallback_gives_the_run_a_tokenizer_that_spells_any_character(tmp_path):
    run = tmp_path / "run"
    data = write_documents(tmp_path / "texts", 40, seed=0)
    flags = ["--vocabulary-size", "300", "--byte-fallback", "--max-steps", "1", "--holdout-fraction", "0.15"]
    assert train_main(["--output-dir", str(run), *TINY_RUN, *flags, "--data", data]) == 0
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(run / "sentencepiece.model"))
    assert sum(pieces.is_byte(i) for i in range(pieces.get_piece_size())) == 256
    assert pieces.unk_id() not in pieces.encode("The Quiet cat ж")  # a lower-case corpus: capitals in bytes
    assert json.loads((run / "run.json").read_text())["training"]["byte_fallback"] is True


def test_text_files_train_evaluate_and_generate_through_the_commands(tmp_path, capsys):
    train_glob = write_documents(tmp_path / "texts", 40, seed=0)
    other_glob = write_documents(tmp_path / "other", 6, seed=1)
    run = tmp_path / "run"
    assert _train(run, "--data", train_glob, "--holdout-fraction", "0.15") == 0
    results = json.loads((run / "results.json").read_text())
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["data"]["dataset"] == train_glob and manifest["data"]["corpus"]["holdout_fraction"] == 0.15
    assert results["data"]["documents"]["validation"] > 0 and np.isfinite(results["test_loss"])
    capsys.readouterr()
    # The run's own held-out split, read again as it was cut for training, scores as training did.
    assert evaluate_main(["--run-dir", str(run), "--split", "validation"]) == 0
    own = json.loads(capsys.readouterr().out)
    assert own["loss"] == pytest.approx(results["validation_loss"], rel=1e-5)
    # Other text is scored whole: every token after the first, once, whatever its line endings.
    assert evaluate_main(["--run-dir", str(run), "--data", other_glob]) == 0
    other = json.loads(capsys.readouterr().out)
    assert other["split"] == "all" and other["data"]["documents"]["train"] == 6 and np.isfinite(other["loss"])
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(run / "sentencepiece.model"))
    lines = [line.strip() for path in sorted(glob.glob(other_glob)) for line in open(path) if line.strip()]
    assert other["tokens"] == sum(len(pieces.encode(line)) + 1 for line in lines) - 1  # each line ends with </s>
    crlf = tmp_path / "crlf"
    crlf.mkdir()
    for path in sorted(glob.glob(other_glob)):
        (crlf / os.path.basename(path)).write_bytes(open(path, "rb").read().replace(b"\n", b"\r\n"))
    assert evaluate_main(["--run-dir", str(run), "--data", str(crlf / "*.txt")]) == 0
    sequences_crlf = json.loads(capsys.readouterr().out)
    assert sequences_crlf["tokens"] == other["tokens"] and sequences_crlf["loss"] == pytest.approx(other["loss"], rel=1e-6)
    causal_lm = ElitaCausalLM.from_preset(preset_of(str(run)))
    assert isinstance(causal_lm.generate("the cat", max_length=12), str)

    # Fine-tuning on new text starts from the run's weights (three Adam steps away from them) and tokenizer.
    new_glob = write_documents(tmp_path / "new", 30, seed=3)
    tuned = tmp_path / "tuned"
    assert _train(tuned, "--init-from", str(run), "--data", new_glob, "--holdout-fraction", "0.2") == 0
    start = causal_lm.backbone.get_weights()
    weights = ElitaCausalLM.from_preset(preset_of(str(tuned))).backbone.get_weights()
    assert max(float(np.abs(a - b).max()) for a, b in zip(weights, start)) < 0.01
    assert (tuned / "sentencepiece.model").read_bytes() == (run / "sentencepiece.model").read_bytes()
    assert json.loads((tuned / "run.json").read_text())["init_from"]["preset"] == str(run)
    # LoRA trains the adapters (and biases) only; merged, the preset is a plain model with the embedding untouched.
    lora = tmp_path / "lora"
    assert _train(lora, "--init-from", str(run), "--data", new_glob, "--holdout-fraction", "0.2", "--lora-rank", "2",
                  "--merge-lora") == 0  # fmt: skip
    results = json.loads((lora / "results.json").read_text())
    assert 0 < results["trainable_params"] < results["params"] / 4
    merged = ElitaCausalLM.from_preset(preset_of(str(lora))).backbone
    assert merged.lora_rank is None and len(merged.weights) == len(start)
    np.testing.assert_array_equal(merged.token_embedding.embeddings, causal_lm.backbone.token_embedding.embeddings)
    assert any(not np.array_equal(a, b) for a, b in zip(merged.get_weights(), start))


def test_fine_tuning_keeps_the_architecture_and_names_a_flag_that_disagrees(tmp_path, capsys):
    glob = write_documents(tmp_path / "texts", 30, seed=0)
    assert _train(tmp_path / "run", "--data", glob, "--holdout-fraction", "0.2", "--max-steps", "1") == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        _train(tmp_path / "tuned", "--init-from", str(tmp_path / "run"), "--data", glob, "--hidden-dim", "32")
    assert "is a model with hidden_dim=16" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _train(tmp_path / "tuned", "--data", glob, "--lora-rank", "2")
    assert "LoRA adapts a trained model" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "tuned")
    # A new model on new text can reuse a run's tokenizer, whose size is then the vocabulary's.
    other = write_documents(tmp_path / "other", 20, seed=5)
    with pytest.raises(SystemExit):
        _train(
            tmp_path / "reuse", "--data", other, "--tokenizer-from", str(tmp_path / "run"), "--vocabulary-size", "50"
        )
    assert "has 40 pieces: the model's vocabulary is the tokenizer's" in capsys.readouterr().err
    reuse = ["--data", other, "--holdout-fraction", "0.2", "--max-steps", "1", "--architecture", "linear"]
    assert _train(tmp_path / "reuse", *reuse, "--tokenizer-from", str(tmp_path / "run")) == 0
    tokenizer = (tmp_path / "run" / "sentencepiece.model").read_bytes()
    assert (tmp_path / "reuse" / "sentencepiece.model").read_bytes() == tokenizer
    assert json.loads((tmp_path / "reuse" / "run.json").read_text())["tokenizer_from"] == str(tmp_path / "run")


def test_json_lines_and_a_tfds_dataset_train(tmp_path, capsys):
    rng = np.random.default_rng(2)
    records = [{"id": i, "body": "\n".join(" ".join(rng.choice(WORDS, 7)) for _ in range(5))} for i in range(60)]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    jsonl = ["--data", str(tmp_path / "c.jsonl"), "--text-field", "body", "--holdout-fraction", "0.2"]
    # Packed: each record is a document that no other one sees, its first token unscored.
    assert _train(tmp_path / "jsonl", *jsonl, "--pack-documents", "--architecture", "transformer") == 0
    manifest = json.loads((tmp_path / "jsonl" / "run.json").read_text())
    assert manifest["data"]["corpus"]["text_field"] == "body" and manifest["training"]["pack_documents"]
    results = json.loads((tmp_path / "jsonl" / "results.json").read_text())
    capsys.readouterr()
    # elita-evaluate scores a packed run as it trained, and plain sequences on request: another figure.
    assert evaluate_main(["--run-dir", str(tmp_path / "jsonl"), "--split", "validation"]) == 0
    packed = json.loads(capsys.readouterr().out)
    assert packed["pack_documents"] and packed["loss"] == pytest.approx(results["validation_loss"], rel=1e-6)
    assert evaluate_main(["--run-dir", str(tmp_path / "jsonl"), "--split", "validation", "--no-pack-documents"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert not plain["pack_documents"] and plain["loss"] != pytest.approx(packed["loss"], rel=1e-4)
    assert packed["tokens"] < plain["tokens"]  # the documents' first tokens are left out
    TinyText(data_dir=str(tmp_path / "tfds")).download_and_prepare()
    assert _train(tmp_path / "tfds-run", "--data", "tfds:tiny_text", "--tfds-dir", str(tmp_path / "tfds")) == 0
    assert json.loads((tmp_path / "tfds-run" / "results.json").read_text())["data"]["source"] == "tfds:tiny_text/1.0.0"


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("empty.txt", b"", r"empty.txt: the file holds no text"),
        ("latin.txt", b"the cat\nthe caf\xe9\n", r"latin.txt, line 2: not UTF-8 text"),
        ("c.jsonl", b'{"text": "the cat"}\n{"body": "the dog"}\n', r"c.jsonl, line 2: no text field 'text'"),
        (
            "short.txt",
            b"the cat sees\n",
            r"The validation split \(.*short.txt\): The corpus is shorter than one sequence",
        ),
    ],
)
def test_bad_text_is_one_line_naming_it_and_nothing_is_written(tmp_path, capsys, name, content, message):
    glob = write_documents(tmp_path / "texts", 30, seed=0)
    (tmp_path / name).write_bytes(content)
    # The bad file is the validation split (the short one), or part of the training text.
    data = ["--data", glob, "--validation-data", str(tmp_path / name)]
    if name.endswith(".jsonl"):
        data = ["--data", str(tmp_path / name)]
    assert _train(tmp_path / "run", *data) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("elita-train: error: ") and len(error.splitlines()) == 1
    assert re.search(message, error), error
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--carry-state"], "carried streams restart at every document already"),
        (["--architecture", "elita-reference"], "position_mode='length' moves them with the sequence's length"),
    ],
)
def test_packing_refuses_what_cannot_restart_at_each_document(tmp_path, capsys, flags, message):
    glob = write_documents(tmp_path / "texts", 30, seed=0)
    with pytest.raises(SystemExit):
        _train(tmp_path / "run", "--data", glob, "--pack-documents", *flags)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("elita-train: error: ") and message in error
    assert not os.path.exists(tmp_path / "run")


def test_a_glob_matching_nothing_stops_at_the_flags(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        _train(tmp_path / "run", "--data", str(tmp_path / "none-*.txt"))
    assert stop.value.code == 2 and "names no file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _train(tmp_path / "run", "--data", "wikitext-2-v1", "--validation-data", "x.txt")
    assert "validation_data" in capsys.readouterr().err and not os.path.exists(tmp_path / "run")
