"""`elita-train --carry-state`: streams, article document_starts, the carried state in checkpoints, exact resumption."""

import csv

import keras
import numpy as np
import pytest

from elita_tf.cli.train import parse_args
from elita_tf.data import load_corpus, stream_dataset, train_sentencepiece
from elita_tf.data.corpus_settings import CorpusSettings
from elita_tf.models import ElitaTokenizer
from elita_tf.training import latest_checkpoint, train
from elita_tf.training.run_directory import RunDirectoryError
from tests.conftest import token_file
from tests.training.test_cli import Interrupt, _args

# 128 rows of the tiny corpus hold 13 segments of 16 tokens: 16 steps cross an epoch boundary.
CARRY = ["--carry-state", "--batch-size", "128", "--max-steps", "16"]


def test_the_stream_marks_article_starts_and_segments_continue_each_other(tiny_wikitext, tmp_path):
    splits, _ = load_corpus(
        CorpusSettings("wikitext-2-v1", data_dir=tiny_wikitext, tfds_dir=str(tmp_path / "tfds")), document_starts=True
    )
    lines = (line.decode() for line, _ in splits["train"].as_numpy_iterator())
    tokenizer = ElitaTokenizer(proto=train_sentencepiece(lines, vocabulary_size=60))
    ids, document_starts = token_file(splits["train"], tokenizer, tmp_path / "train", vocabulary_size=60).stream()
    # The tiny corpus has a ` = Heading k = ` article title every 20 lines: 20 in its 400 lines.
    assert document_starts.sum() == 20
    heading = np.asarray(tokenizer.tokenize("= Heading 3 ="))  # the line's pieces, before its end-of-line id
    starts = np.flatnonzero(document_starts)
    np.testing.assert_array_equal(ids[starts[3] : starts[3] + len(heading)], heading)
    batches = [
        ((x["token_ids"], x["document_starts"]), y)
        for x, y in stream_dataset(ids, document_starts, 4, 16, epochs=2).as_numpy_iterator()
    ]
    per_epoch = (len(ids) // 4 - 1) // 16
    assert len(batches) == 2 * per_epoch
    (first, first_document_starts), first_targets = batches[0]
    (second, _), _ = batches[1]
    row = len(ids) // 4
    np.testing.assert_array_equal(first[1], ids[row : row + 16])  # row b reads its own part of the stream
    np.testing.assert_array_equal(first_targets[:, -1], second[:, 0])  # step k + 1 continues step k
    assert first_document_starts[:, 0].all()  # each row starts a state, and so does each epoch
    (again, again_document_starts), _ = batches[per_epoch]
    np.testing.assert_array_equal(again, first)
    assert again_document_starts[:, 0].all()
    np.testing.assert_array_equal(
        first_document_starts[:, 1:], document_starts[np.arange(4)[:, None] * row + np.arange(1, 16)]
    )


def test_carry_state_trains_checkpoints_its_state_and_resumes_exactly(tiny_wikitext, tmp_path):
    whole = tmp_path / "whole"
    results = train(parse_args(_args(tiny_wikitext, whole, *CARRY)))
    assert results["steps"] == 16 and np.isfinite(results["test_loss"])
    assert results["config"]["settings"]["carry_state"] is True
    losses = [float(row["loss"]) for row in csv.DictReader(open(whole / "steps.csv"))]
    assert losses[-1] < losses[0]
    model = keras.models.load_model(latest_checkpoint(whole))
    # The checkpoint holds every block's state for the 128 streams, 3 segments into the second epoch.
    assert model.carried_state["block_0"]["mean"].shape[0] == 128
    assert 0 < model.carried_state["position"].numpy().max() <= 3 * 16

    # Killed at step 7, resumed from the checkpoint at step 5 (state included): the same model.
    split = tmp_path / "split"
    with pytest.raises(KeyboardInterrupt):
        train(parse_args(_args(tiny_wikitext, split, *CARRY)), callbacks=[Interrupt(7)])
    resumed = train(parse_args(_args(tiny_wikitext, split, *CARRY)))
    other = keras.models.load_model(latest_checkpoint(split))
    for a, b in zip(model.weights + model.optimizer.variables, other.weights + other.optimizer.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=a.path)
    for a, b in zip(*(keras.tree.flatten(m.carried_state) for m in (model, other))):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)
    assert resumed["test_loss"] == pytest.approx(results["test_loss"], abs=1e-6)
    # The run is a carried-state run: resuming it without the flag is refused.
    with pytest.raises(RunDirectoryError, match=r"training.carry_state: stored True, requested False"):
        train(parse_args(_args(tiny_wikitext, whole, "--batch-size", "128", "--max-steps", "16")))


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--architecture", "transformer"], "Carrying the state over a stream needs blocks that keep a constant-size"),
        (["--architecture", "linear"], "position_embedding=True"),
        (["--architecture", "elita-reference"], "position_mode='length'"),
        (
            ["--strategy", "mirrored"],
            "`carry_state` needs strategy='default' and no model_parallel. Received: strategy='mirrored', "
            "model_parallel=None",
        ),
    ],
)
def test_carry_state_refuses_what_cannot_carry_a_state(tiny_wikitext, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit):
        parse_args(_args(tiny_wikitext, tmp_path / "run", "--carry-state", *extra))
    assert message in capsys.readouterr().err
