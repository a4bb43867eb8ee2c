import json
import os
import subprocess
import sys
import types

import keras
import keras_hub
import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from elita_tf.cli.export import main as export_main
from elita_tf.data import train_sentencepiece
from elita_tf.export import export_saved_model, load_saved_model
from elita_tf.models import ElitaBackbone, ElitaCausalLM, ElitaCausalLMPreprocessor, ElitaTokenizer
from elita_tf.training import save_checkpoint
from tests.conftest import PRESET_FILES, rare_character_lines

BIN = os.path.dirname(sys.executable)
PROMPTS = ["the cat", "a dog sees the"]
LINES = [f"the cat number {i} sees a dog and a house ." for i in range(300)]
SIZE = {"hidden_dim": 16, "num_layers": 2, "num_heads": 2, "head_dim": 8, "max_sequence_length": 64}


def _causal_lm(name, proto, dtype=None):
    keras.utils.set_random_seed(0)
    vocabulary_size = sentencepiece.SentencePieceProcessor(model_proto=proto).get_piece_size()
    backbone = ElitaBackbone.from_architecture(name, vocabulary_size=vocabulary_size, dtype=dtype, **SIZE)
    return ElitaCausalLM(backbone, ElitaCausalLMPreprocessor(ElitaTokenizer(proto=proto), sequence_length=16))


def _prompt_ids(proto, prompts):
    """Each prompt's ids as `ElitaCausalLM.generate` reads them: after the start token."""
    start = ElitaTokenizer(proto=proto).start_token_id
    return [[start] + row for row in sentencepiece.SentencePieceProcessor(model_proto=proto).encode(prompts)]


def _greedy_ids(causal_lm, proto, prompts, new_tokens):
    """Each prompt's `new_tokens` greedy ids, through `ElitaCausalLM.generate` on token ids."""
    ids = _prompt_ids(proto, prompts)
    width = max(map(len, ids)) + new_tokens
    token_ids = np.array([row + [0] * (width - len(row)) for row in ids], "int32")
    padding_mask = np.array([[i < len(row) for i in range(width)] for row in ids])
    greedy = ElitaCausalLM(causal_lm.backbone)
    greedy.compile(sampler="greedy")
    out = greedy.generate({"token_ids": token_ids, "padding_mask": padding_mask}, stop_token_ids=None)["token_ids"]
    return np.array([out[row, len(p) : len(p) + new_tokens] for row, p in enumerate(ids)])


@pytest.fixture(scope="module")
def proto():
    return train_sentencepiece(LINES, vocabulary_size=40)


@pytest.fixture(scope="module", params=["elita", "transformer"])
def exported(request, proto, tmp_path_factory):
    causal_lm = _causal_lm(request.param, proto)
    path = str(tmp_path_factory.mktemp("saved") / request.param)
    export_saved_model(causal_lm, path)
    tokens = _greedy_ids(causal_lm, proto, PROMPTS, 6)
    text = sentencepiece.SentencePieceProcessor(model_proto=proto).decode(np.asarray(tokens).tolist())
    return path, causal_lm.backbone, text


LOAD = """
import json, sys, numpy as np, tensorflow as tf, tensorflow_text  # tensorflow_text registers the tokenizer ops
loaded = tf.saved_model.load(sys.argv[1])
logits = loaded.signatures["serving_default"](token_ids=tf.constant([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], tf.int32))
out = loaded.signatures["generate"](prompts=tf.constant(json.loads(sys.argv[2])), max_new_tokens=tf.constant(6))
print(json.dumps({"logits": logits["logits"].numpy().tolist(), "text": [t.decode() for t in out["text"].numpy()]}))
"""


def test_fresh_process_gives_the_keras_logits_and_text(exported):
    path, backbone, text = exported
    proc = subprocess.run([sys.executable, "-c", LOAD, path, json.dumps(PROMPTS)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    ids = np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], "int32")
    want = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    np.testing.assert_allclose(got["logits"], want, rtol=1e-5, atol=1e-5)
    assert got["text"] == text


def test_generate_gives_the_greedy_text_of_elita_causal_lm_generate(proto, tmp_path):
    causal_lm = _causal_lm("elita", proto)
    export_saved_model(causal_lm, str(tmp_path / "saved"))
    generate = tf.saved_model.load(str(tmp_path / "saved")).signatures["generate"]
    causal_lm.compile(sampler="greedy")
    pieces = sentencepiece.SentencePieceProcessor(model_proto=proto)
    for prompt, ids in zip(PROMPTS, _prompt_ids(proto, PROMPTS)):
        # keras-hub's `max_length` counts the start token and the prompt.
        want = causal_lm.generate(prompt, max_length=len(ids) + 6, stop_token_ids=None)
        new = generate(prompts=tf.constant([prompt]), max_new_tokens=tf.constant(6))["token_ids"][0]
        assert pieces.decode(ids[1:] + new.numpy().tolist()) == want


def test_signatures_refuse_or_define_every_edge_case(exported):
    path, backbone, _ = exported
    loaded = tf.saved_model.load(path)
    generate = loaded.signatures["generate"]

    def run(prompts, n):
        return generate(prompts=tf.constant(prompts), max_new_tokens=tf.constant(n, tf.int32))

    out = run(["the cat", ""], 0)  # no new tokens: empty texts, not an error
    assert out["token_ids"].shape == (2, 0) and [t.decode() for t in out["text"].numpy()] == ["", ""]
    # An empty prompt continues from the end-of-line id, as a new line of the training text.
    assert run([""], 5)["token_ids"].shape == (1, 5)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"max_new_tokens must be >= 0.*-1"):
        run(["the cat"], -1)
    if backbone.decode_limit is not None:
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"the 64 positions.*\[max_new_tokens =\] \[100\]"):
            run(["the cat"], 100)
    else:  # ELiTA's constant-size state decodes past the training length
        assert run(["the cat"], 100)["token_ids"].shape == (1, 100)
    # One request cannot ask for unbounded work: the cap set at export (1024 by default) is named.
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"at most 1024, the cap.*\[1025\]"):
        run(["the cat"], 1025)
    serve = loaded.signatures["serving_default"]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"vocabulary_size=40.*\[40\] \[at\] \[\[0 1\]\]"):
        serve(token_ids=tf.constant([[1, 40, 2]], tf.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"vocabulary_size=40.*\[-2\]"):
        serve(token_ids=tf.constant([[1, 2, -2]], tf.int32))


def test_generate_refuses_zero_prompts_by_their_count(exported):
    path, _, _ = exported
    generate = tf.saved_model.load(path).signatures["generate"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="generate needs at least one prompt. Received: 0 prompts"):
        generate(prompts=tf.constant([], tf.string), max_new_tokens=tf.constant(3))


def test_saved_model_cli_shows_and_runs_the_signatures(exported, tmp_path):
    path, _, _ = exported
    np.save(tmp_path / "ids.npy", np.array([[1, 2, 3]], np.int32))
    np.save(tmp_path / "prompts.npy", np.array([b"the cat"], dtype=object), allow_pickle=True)
    np.save(tmp_path / "n.npy", np.int32(4))
    show = subprocess.run(
        [os.path.join(BIN, "saved_model_cli"), "show", "--dir", path, "--all"], capture_output=True, text=True
    )
    assert show.returncode == 0, show.stderr[-2000:]
    assert "signature_def['serving_default']" in show.stdout and "signature_def['generate']" in show.stdout
    # Running loads the whole graph, tokenizer included: TensorFlow's saved_model_cli, with the
    # tensorflow-text ops registered first.
    cli = (
        "import sys, tensorflow_text; from tensorflow.python.tools import saved_model_cli; "
        "sys.exit(saved_model_cli.main())"
    )

    def cli_run(signature, inputs):
        proc = subprocess.run(
            [sys.executable, "-c", cli, "run", "--dir", path, "--tag_set", "serve"]
            + ["--signature_def", signature, "--inputs", inputs],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    assert "logits" in cli_run("serving_default", f"token_ids={tmp_path / 'ids.npy'}")
    assert "text" in cli_run("generate", f"prompts={tmp_path / 'prompts.npy'};max_new_tokens={tmp_path / 'n.npy'}")


def test_a_byte_fallback_tokenizer_serves_rare_characters(tmp_path):
    proto = train_sentencepiece(rare_character_lines(200), vocabulary_size=300)  # too few pieces for each character
    pieces = sentencepiece.SentencePieceProcessor(model_proto=proto)
    prompts = ["the cat \u4e00\u4e01", "new \u0436 \U0001d11e \u2603"]  # and characters the corpus never had
    ids = pieces.encode(prompts)
    assert all(pieces.is_byte(row[-1]) for row in ids) and pieces.unk_id() not in sum(ids, [])
    causal_lm = _causal_lm("elita", proto)
    path = export_saved_model(causal_lm, str(tmp_path / "saved"))
    # The graph's tokenizer spells them in the same byte pieces: the same prompt ids, so the same greedy tokens.
    assert sentencepiece.SentencePieceProcessor(model_proto=proto).encode(prompts) == ids
    out = load_saved_model(path).signatures["generate"](prompts=tf.constant(prompts), max_new_tokens=tf.constant(5))
    np.testing.assert_array_equal(out["token_ids"], _greedy_ids(causal_lm, proto, prompts, 5))


def test_export_cli_from_a_run_directory_under_any_keras_backend(proto, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    save_checkpoint(ElitaCausalLM(ElitaBackbone.from_architecture("elita", vocabulary_size=40, **SIZE)), str(run), 1)
    (run / "run.json").write_text(json.dumps({"training": {"sequence_length": 16}}))
    with pytest.raises(SystemExit):
        export_main(["--run-dir", str(run), "--output", str(tmp_path / "out")])
    assert "sentencepiece.model" in capsys.readouterr().err
    (run / "sentencepiece.model").write_bytes(proto)
    # The exports are TensorFlow's: under KERAS_BACKEND=torch the command runs Keras on TensorFlow all the same.
    command = [sys.executable, "-m", "elita_tf.cli.export", "--run-dir", str(run), "--output", str(tmp_path / "out")]
    torch = {**os.environ, "KERAS_BACKEND": "torch"}
    done = subprocess.run([*command, "--max-new-tokens", "8"], capture_output=True, text=True, env=torch)
    assert done.returncode == 0, done.stderr[-3000:]
    assert os.path.exists(tmp_path / "out" / "saved_model.pb")
    # The summary says how to load it (its tokenizer's ops) and the cap it was given.
    printed = done.stdout
    assert "load_saved_model" in printed and "import tensorflow_text" in printed and "at most 8 new tokens" in printed
    generate = load_saved_model(str(tmp_path / "out")).signatures["generate"]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"at most 8, the cap"):
        generate(prompts=tf.constant(["the cat"]), max_new_tokens=tf.constant(9))
    # A preset holds the model and its tokenizer only, ready for keras_hub.upload_preset, and loads in keras-hub.
    assert export_main(["--run-dir", str(run), "--format", "preset", "--output", str(tmp_path / "preset")]) == 0
    assert sorted(os.listdir(tmp_path / "preset")) == PRESET_FILES
    loaded = keras_hub.models.CausalLM.from_preset(str(tmp_path / "preset"))
    assert isinstance(loaded, ElitaCausalLM) and loaded.preprocessor.sequence_length == 16


def test_export_cli_called_where_keras_runs_on_another_backend_runs_again_on_tensorflow(monkeypatch):
    # Keras imported already, on another backend: the command runs as it was called, in a process of its own.
    from elita_tf.cli import export as export_cli

    calls = []

    def run(command, env):
        calls.append((command, env))
        return types.SimpleNamespace(returncode=3)

    monkeypatch.setattr(keras.config, "backend", lambda: "torch")
    monkeypatch.setattr(subprocess, "run", run)
    assert export_cli.main(["--run-dir", "run", "--output", "out"]) == 3
    [(command, env)] = calls
    assert command == [sys.executable, "-m", "elita_tf.cli.export", "--run-dir", "run", "--output", "out"]
    assert env["KERAS_BACKEND"] == "tensorflow"


# One rounding step of each compute dtype (its machine epsilon).
EPSILON = {"float16": 2.0**-10, "bfloat16": 2.0**-7}


@pytest.mark.parametrize("policy_name", ["mixed_float16", "mixed_bfloat16"])
def test_a_mixed_precision_model_exports_and_generates_the_keras_tokens(policy_name, proto, tmp_path):
    causal_lm = _causal_lm("additive", proto, dtype=policy_name)
    export_saved_model(causal_lm, str(tmp_path / "saved"))
    want = _greedy_ids(causal_lm, proto, PROMPTS, 6)
    got = (
        tf.saved_model.load(str(tmp_path / "saved"))
        .signatures["generate"](prompts=tf.constant(PROMPTS), max_new_tokens=tf.constant(6))["token_ids"]
        .numpy()
    )
    # The traced graph and eager Keras round in different orders, so at a near-tie of two logits (one
    # rounding step apart in the compute dtype) each may pick the other token. Each row must agree up to
    # its first difference, and there the two tokens' logits, recomputed over the shared prefix, must tie.
    epsilon = EPSILON[keras.mixed_precision.Policy(policy_name).compute_dtype]
    prompt_ids = _prompt_ids(proto, PROMPTS)
    differing = 0
    for prompt, got_row, want_row in zip(prompt_ids, got, want):
        mismatch = np.flatnonzero(got_row != want_row)
        if mismatch.size == 0:
            continue
        differing += 1
        prefix = np.array([prompt + list(want_row[: mismatch[0]])], "int32")
        logits = causal_lm.backbone({"token_ids": prefix, "padding_mask": np.ones_like(prefix)})[0, -1]
        logits = np.asarray(tf.cast(logits, tf.float32))
        pair = logits[[got_row[mismatch[0]], want_row[mismatch[0]]]]
        assert abs(pair[0] - pair[1]) <= 4 * epsilon * max(1.0, *abs(pair)), (mismatch[0], pair)
    assert differing < len(PROMPTS), (got, want)


def _refused(argv, capsys):
    """`elita-export`'s error for `argv`, which it refuses with exit status 2 (a usage error)."""
    with pytest.raises(SystemExit) as stop:
        export_main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_export_cli_writes_only_over_its_own_exports(tmp_path, capsys):
    run = str(tmp_path / "no-run")  # refused before the model loads: the run need not exist
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    preset = tmp_path / "preset"
    preset.mkdir()
    (preset / "config.json").write_text(json.dumps({"class_name": "ElitaBackbone", "config": {}}))
    other_preset = tmp_path / "gemma"
    other_preset.mkdir()
    (other_preset / "config.json").write_text(json.dumps({"class_name": "GemmaBackbone", "config": {}}))
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"graph")
    (tmp_path / "file").write_text("a file")
    for output, format in [
        (mine, "saved_model"),
        (mine, "preset"),
        (other_preset, "preset"),
        (preset, "saved_model"),  # an export, of another format
        (saved, "preset"),
        (tmp_path / "file", "saved_model"),
    ]:
        err = _refused(["--run-dir", run, "--output", str(output), "--format", format], capsys)
        assert err.count("\n") == 1 and f"Received: output={output}" in err and "not an elita-train run" not in err
    assert (mine / "notes.txt").read_text() == "keep me" and (tmp_path / "file").read_text() == "a file"
    # An earlier export of the same format, an empty directory or a new path: on to loading the run.
    (tmp_path / "empty").mkdir()
    for output, format in [(saved, "saved_model"), (preset, "preset"), (tmp_path / "empty", "saved_model")]:
        err = _refused(["--run-dir", run, "--output", str(output), "--format", format], capsys)
        assert "is not an elita-train run directory" in err, err
    err = _refused(["--run-dir", run, "--output", str(tmp_path / "new")], capsys)
    assert "is not an elita-train run directory" in err, err


def test_a_cap_past_the_int32_max_new_tokens_is_refused_when_parsed(tmp_path, capsys):
    run, out = str(tmp_path / "no-run"), str(tmp_path / "out")
    err = _refused(["--run-dir", run, "--output", out, "--max-new-tokens", "3000000000"], capsys)
    assert err.count("\n") == 1 and "at most 2147483647" in err and "Received: max_new_tokens=3000000000" in err
    err = _refused(["--run-dir", run, "--output", out, "--max-new-tokens", "2147483647"], capsys)
    assert "is not an elita-train run directory" in err, err  # the largest cap passes, on to loading the run
    with pytest.raises(ValueError, match="Received: max_new_tokens=2147483648"):
        export_saved_model(None, out, max_new_tokens=2**31)
