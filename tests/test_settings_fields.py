"""`elita_tf.settings_fields`: each settings field's help, written once, is its docstring entry and its `--help`."""

import argparse
import dataclasses

import pytest

from elita_tf.cli.flags import add_flags, flag_help
from elita_tf.data.corpus_settings import CorpusSettings
from elita_tf.settings_fields import check_field, setting, with_attributes
from elita_tf.training.settings import TrainSettings


@pytest.mark.parametrize("settings_class", [TrainSettings, CorpusSettings])
def test_every_field_has_help_and_its_docstring_entry_is_that_help(settings_class):
    doc = " ".join(settings_class.__doc__.split())
    for field in dataclasses.fields(settings_class):
        help_text = field.metadata["help"]
        assert help_text and help_text.endswith("."), field.name
        assert f"{field.name}: " in doc and " ".join(help_text.split()) in doc, field.name


def test_every_flag_of_elita_train_has_its_fields_help():
    parser = add_flags(argparse.ArgumentParser(), TrainSettings)
    # An old flag (`elita_tf.renames`) is hidden from --help and sets today's field.
    shown = [action for action in parser._actions if action.help != argparse.SUPPRESS]
    actions = {action.dest: action for action in shown if action.dest != "help"}
    fields = [f for cls in (TrainSettings, CorpusSettings) for f in dataclasses.fields(cls) if f.name != "corpus"]
    assert sorted(actions) == sorted(field.name for field in fields)
    assert all(actions[field.name].help for field in fields)
    # These eight had none before: each now says what it is.
    assert actions["sequence_length"].help.startswith("Tokens in a training example (T, at least 2)")
    for name in ("batch_size", "epochs", "seed", "vocabulary_size", "optimizer", "strategy", "output_dir"):
        assert len(actions[name].help) > 20, name


def test_help_reads_fields_as_flags_and_says_the_default():
    dropout = {f.name: f for f in dataclasses.fields(TrainSettings)}["dropout"]
    text = flag_help(TrainSettings, dropout)
    assert "`" not in text and text.endswith("Default: the backbone's, 0.")
    epochs = {f.name: f for f in dataclasses.fields(TrainSettings)}["epochs"]
    assert flag_help(TrainSettings, epochs) == (
        "Passes over the train split (--max-steps may end the run sooner). Default: 1."
    )
    assert flag_help(TrainSettings, epochs, "the run's").endswith("Default: the run's.")
    assert "Defaults to `1`." in " ".join(TrainSettings.__doc__.split())


def test_a_field_without_help_is_refused_and_a_field_is_checked_by_its_own_check():
    @dataclasses.dataclass(frozen=True)
    class Settings:
        """Settings.

        Example:
        >>> Settings()
        """

        size: int = dataclasses.field(default=1)

    with pytest.raises(ValueError, match=r"Every settings field has help. Received: Settings.size"):
        with_attributes(Settings)
    with pytest.raises(ValueError, match=r"`seeds` must be a non-negative integer. Received: seeds=-1"):
        check_field(TrainSettings, "seed", -1, shown_as="seeds")
    check_field(TrainSettings, "max_steps", None)  # None where None is the default
    choices = r"\['default', 'mirrored', 'multiworker', 'data-parallel'\]"
    with pytest.raises(ValueError, match=rf"`strategy` must be one of {choices}"):
        TrainSettings("run", strategy="tpu")
    assert setting(CorpusSettings, "The text.").default_factory is CorpusSettings
