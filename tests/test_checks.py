"""`elita_tf.checks`: one function a rule, one message, the same at a setting's three places."""

import re
import subprocess
import sys

import numpy as np
import pytest

from elita_tf import checks


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: checks.check_integer("heads", 0), "`heads` must be a positive integer. Received: heads=0"),
        (lambda: checks.check_integer("heads", True), "`heads` must be a positive integer. Received: heads=True"),
        (
            lambda: checks.check_integer("heads", np.int64(4)),
            "`heads` must be a positive integer, a Python int (`int(x)`): it goes into the JSON of a config. "
            "Received: heads=np.int64(4)",
        ),
        (lambda: checks.check_integer("seed", -1, least=0), "`seed` must be a non-negative integer. Received: seed=-1"),
        (lambda: checks.check_integer("n", 3, most=2), "`n` must be at most 2. Received: n=3"),
        (lambda: checks.check_integer("k", 0.5, 1, 9, True), "`k` must be None or a positive integer. Received: k=0.5"),
        (lambda: checks.check_sequence_length("t", 1), "`t` must be an integer >= 2. Received: t=1"),
        (lambda: checks.check_sequence_length("t", 2**31), "`t` must be at most 2147483647. Received: t=2147483648"),
        (lambda: checks.check_dropout("dropout", 1.0), "`dropout` must be in [0, 1). Received: dropout=1.0"),
        (lambda: checks.check_dropout("dropout", -0.1), "`dropout` must be in [0, 1). Received: dropout=-0.1"),
        (lambda: checks.check_dropout("dropout", False), "`dropout` must be in [0, 1). Received: dropout=False"),
        (lambda: checks.check_positive_number("eps", 0), "`eps` must be a positive number. Received: eps=0"),
        (lambda: checks.check_choice("mode", "x", ("a", "b")), "`mode` must be one of ['a', 'b']. Received: mode='x'"),
        (
            lambda: checks.check_vocabulary_size("vocabulary_size", 4),
            "`vocabulary_size` must be an integer >= 5: SentencePiece's 3 special pieces, the word boundary and a "
            "character. Received: vocabulary_size=4",
        ),
        (lambda: checks.check_path("run_dir", None), "`run_dir` must be a path, a non-empty str. Received: run_dir=None"),
        (lambda: checks.check_path("run_dir", ""), "`run_dir` must be a path, a non-empty str. Received: run_dir=''"),
    ],
)
def test_each_check_names_what_it_expected_and_the_value_received(call, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


def test_each_check_returns_the_value_in_its_one_type():
    assert checks.check_integer("n", 2**31 - 1) == 2**31 - 1
    assert checks.check_integer("n", None, optional=True) is None
    assert checks.check_sequence_length("t", 2) == 2
    assert checks.check_dropout("dropout", 0) == 0.0 and isinstance(checks.check_dropout("dropout", 0), float)
    assert checks.check_positive_number("eps", 1) == 1.0 and checks.check_positive_number("e", None, True) is None
    assert checks.check_choice("mode", None, (None, "a")) is None


def test_dropout_and_sequence_length_are_checked_alike_at_their_three_places():
    # --dropout: the settings field, the backbone argument, the layer argument; the same for the length.
    from elita_tf.layers import DecoderBlock, PositionEmbedding, ShapedAttention
    from elita_tf.models import ElitaBackbone
    from elita_tf.training.settings import TrainSettings

    for make in (
        lambda: TrainSettings("run", dropout=1.5),
        lambda: ElitaBackbone(vocabulary_size=8, dropout=1.5),
        lambda: DecoderBlock(ShapedAttention(2), dropout=1.5),
    ):
        with pytest.raises(ValueError, match=re.escape("`dropout` must be in [0, 1). Received: dropout=1.5")):
            make()
    for name, make in (
        ("sequence_length", lambda: TrainSettings("run", sequence_length=1)),
        ("max_sequence_length", lambda: ElitaBackbone(vocabulary_size=8, max_sequence_length=1)),
        ("max_sequence_length", lambda: PositionEmbedding(1)),
    ):
        with pytest.raises(ValueError, match=re.escape(f"`{name}` must be an integer >= 2. Received: {name}=1")):
            make()


def test_what_would_fail_later_is_refused_when_the_settings_are_made():
    # SentencePiece's trainer fails inside (trainer_interface.cc) below 5 pieces, after TensorFlow has started;
    # a run directory of None fails at its first use.
    from elita_tf.training.evaluate_settings import EvaluateSettings
    from elita_tf.training.settings import TrainSettings

    for size in (1, 2, 4):
        message = rf"^`vocabulary_size` must be an integer >= 5: .* Received: vocabulary_size={size}$"
        with pytest.raises(ValueError, match=message):
            TrainSettings("run", vocabulary_size=size)
    assert TrainSettings("run", vocabulary_size=5).vocabulary_size == 5
    with pytest.raises(ValueError, match=r"^`run_dir` must be a path, a non-empty str. Received: run_dir=None$"):
        EvaluateSettings(None)
    with pytest.raises(ValueError, match=r"Received: output_dir=None$"):
        TrainSettings(None)


def test_the_checks_import_without_tensorflow():
    code = "import sys, elita_tf.checks, elita_tf.settings_fields; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
