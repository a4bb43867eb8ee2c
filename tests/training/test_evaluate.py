"""`elita-evaluate` beyond the training sequences: longer sequences, one carried stream, loss by position."""

import json

import numpy as np
import pytest
import tensorflow as tf

from elita_tf.cli.evaluate import main as evaluate_main
from elita_tf.cli.train import parse_args
from elita_tf.data import load_corpus
from elita_tf.data.corpus_settings import CorpusSettings
from elita_tf.models import ElitaCausalLM
from elita_tf.training import EvaluateSettings, evaluate, preset_of, train
from elita_tf.training.evaluation import position_buckets
from tests.conftest import token_file
from tests.training.test_cli import _args


@pytest.fixture(scope="module")
def elita_run(tiny_wikitext, tmp_path_factory):
    out = tmp_path_factory.mktemp("evaluate") / "elita"
    # The reference's positions, which run on past the training length (a new run's default clamps them).
    train(parse_args(_args(tiny_wikitext, out, "--max-steps", "4", "--position-mode", "fixed")))
    return str(out), {"data_dir": tiny_wikitext, "tfds_dir": str(out) + "_tfds"}


def test_position_buckets_are_log_spaced_up_to_the_length():
    assert position_buckets(16) == [(0, 16)]
    assert position_buckets(300) == [(0, 16), (16, 64), (64, 256), (256, 300)]
    assert position_buckets(1024) == [(0, 16), (16, 64), (64, 256), (256, 1024)]


def test_sequences_of_another_length_report_the_loss_by_position(elita_run):
    run, data = elita_run
    own = evaluate(EvaluateSettings(run, eval_batches=1, **data))  # the run's sequences (T = 16): one bucket
    assert [(b["start"], b["end"]) for b in own["loss_by_position"]] == [(0, 16)]
    assert own["loss_by_position"][0]["loss"] == pytest.approx(own["loss"], rel=1e-9)
    assert own["tokens"] == own["sequences"] * 16 and own["sequence_length"] == 16
    longer = evaluate(EvaluateSettings(run, sequence_length=40, batch_size=4, **data))
    buckets = longer["loss_by_position"]
    assert [(b["start"], b["end"]) for b in buckets] == [(0, 16), (16, 40)]
    assert sum(b["tokens"] for b in buckets) == longer["tokens"] == longer["sequences"] * 40
    mean = sum(b["loss"] * b["tokens"] for b in buckets) / longer["tokens"]
    assert longer["loss"] == pytest.approx(mean, rel=1e-9) and np.isfinite(longer["loss"])


def test_clamped_positions_read_the_same_weights_past_the_training_length(elita_run):
    run, data = elita_run
    fixed = evaluate(EvaluateSettings(run, sequence_length=40, batch_size=4, **data))
    clamped = evaluate(EvaluateSettings(run, sequence_length=40, batch_size=4, position_mode="clamped", **data))
    assert (fixed["position_mode"], clamped["position_mode"]) == ("fixed", "clamped")
    # Up to the training length (16) the two modes are one function; past it they differ.
    inside, past = (b["loss"] for b in fixed["loss_by_position"])
    assert clamped["loss_by_position"][0]["loss"] == pytest.approx(inside, rel=1e-6)
    assert clamped["loss_by_position"][1]["loss"] != pytest.approx(past, rel=1e-6)


def test_the_carried_stream_equals_one_forward_pass_over_the_whole_split(elita_run, tmp_path):
    run, data = elita_run
    result = evaluate(EvaluateSettings(run, sequence_length=16, carry_state=True, **data))
    # The same stream in one parallel pass: segments of 16 with carried states give the same losses.
    causal_lm = ElitaCausalLM.from_preset(preset_of(run))
    splits, _ = load_corpus(CorpusSettings(**data), document_starts=True)
    stream, _ = token_file(splits["test"], causal_lm.preprocessor.tokenizer, tmp_path / "test").stream()
    ids = tf.constant(stream[None, :-1])
    logits = causal_lm({"token_ids": ids, "padding_mask": tf.ones_like(ids)})
    per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(stream[None, 1:], logits)[0].numpy()
    assert result["tokens"] == len(per_token) > 1000 and result["sequences"] == 1
    assert result["loss"] == pytest.approx(per_token.mean(), rel=1e-5)
    for bucket in result["loss_by_position"]:
        want = per_token[bucket["start"] : bucket["end"]].mean()
        assert bucket["loss"] == pytest.approx(want, rel=1e-4, abs=1e-5), bucket
    assert result["loss_by_position"][-1]["end"] == len(per_token)
    # --eval-batches caps the segments of the stream as it caps the batches of sequences.
    capped = evaluate(EvaluateSettings(run, sequence_length=16, carry_state=True, eval_batches=3, **data))
    assert capped["tokens"] == 3 * 16
    assert capped["loss"] == pytest.approx(per_token[:48].mean(), rel=1e-5)


def test_the_cli_writes_the_json_and_refuses_what_cannot_be_done(elita_run, tmp_path, capsys):
    run, data = elita_run
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in data.items()]
    output = tmp_path / "by_position.json"
    assert evaluate_main(["--run-dir", run, "--sequence-length", "32", "--output", str(output), *flags]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(output.read_text()) == printed and printed["sequence_length"] == 32
    for extra, message in [
        (["--sequence-length", "1"], "sequence_length=1"),
        (["--carry-state", "--litert", "x.tflite"], "LiteRT file is scored in the run's own sequences"),
        # Checked before any work: the evaluation is not lost to a missing directory at the end.
        (["--output", str(tmp_path / "missing" / "out.json")], "is not a writable directory"),
    ]:
        try:
            status = evaluate_main(["--run-dir", run, *extra, *flags])
        except SystemExit as exit:  # refused while parsing the arguments
            status = exit.code
        assert status == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_carrying_state_needs_constant_size_states(tiny_wikitext, tmp_path):
    run = tmp_path / "transformer"
    train(parse_args(_args(tiny_wikitext, run, "--architecture", "transformer", "--max-steps", "1")))
    data = {"data_dir": tiny_wikitext, "tfds_dir": str(run) + "_tfds"}
    with pytest.raises(ValueError, match="constant-size state.*blocks=\\['transformer'\\]"):
        evaluate(EvaluateSettings(str(run), carry_state=True, **data))
    with pytest.raises(ValueError, match="learned positions for at most max_sequence_length=16.*sequence_length=32"):
        evaluate(EvaluateSettings(str(run), sequence_length=32, **data))
