"""`elita-train`: train (or resume) a language model of a named architecture on WikiText or your own text.

    elita-train --architecture elita --output-dir runs/elita --epochs 3
    elita-train --data "my-texts/*.txt" --output-dir runs/mine
    elita-train --data corpus.jsonl --text-field body --output-dir runs/jsonl
    elita-train --data tfds:lm1b --output-dir runs/lm1b
    elita-train --init-from runs/mine --data "new-texts/*.txt" --lora-rank 8 --output-dir runs/tuned

Every flag is a field of `elita_tf.training.TrainSettings` or its `elita_tf.data.CorpusSettings`
(`elita_tf.cli.flags`); the loop is `elita_tf.training.train`.
"""

import argparse
import os
import sys

# Only modules without TensorFlow until the arguments are parsed: `--help` and a bad flag answer at once.
from elita_tf.cli.errors import DEBUG_HELP, ArgumentParser, run_command, split_debug
from elita_tf.cli.flags import add_flags
from elita_tf.cli.quiet import start_tensorflow
from elita_tf.data.sources import DATA_DIR_ENV, split_files
from elita_tf.data.text_files import TextCorpus, data_kind
from elita_tf.training.run_files import list_checkpoints
from elita_tf.training.settings import TrainSettings, train_settings


def parse_args(argv=None):
    """`TrainSettings` from command-line arguments; a bad value exits with its message."""
    parser = ArgumentParser(prog="elita-train", description=__doc__.split("\n\n")[0])
    add_flags(parser, TrainSettings)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    try:
        settings = train_settings(**{k: v for k, v in vars(parser.parse_args(argv)).items() if k != "debug"})
    except ValueError as error:
        parser.error(str(error))
    if settings.init_from is not None or settings.tokenizer_from is not None or settings.carry_state:
        # The flags given on the command line, defaults aside: a fine-tuned model's must agree with them.
        unset = add_flags(argparse.ArgumentParser(), TrainSettings, defaults=False, warn_old_names=False)
        given = {key for key, value in vars(unset.parse_known_args(argv)[0]).items() if value is not None}
        # These read a model, a tokenizer or the backbone's defaults: TensorFlow.
        start_tensorflow()
        from elita_tf.training.model_settings import (
            FINE_TUNED_FIELDS,
            check_carry_state,
            init_from_settings,
            tokenizer_from_settings,
        )

        try:
            settings = init_from_settings(settings, [key for key in FINE_TUNED_FIELDS if key in given])
            settings = tokenizer_from_settings(settings, "vocabulary_size" in given)
            if settings.carry_state:
                check_carry_state(settings)
        except (FileNotFoundError, ValueError) as error:
            parser.error(str(error))
    corpus = settings.corpus
    try:  # the data's files exist (a full check of the text comes before the run writes anything)
        if data_kind(corpus.data) == "wikitext":
            if corpus.data_dir or os.environ.get(DATA_DIR_ENV):
                split_files(corpus.data_dir or os.environ[DATA_DIR_ENV], corpus.data)
        elif data_kind(corpus.data) != "tfds":
            TextCorpus(corpus)
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    return settings


def resume_hint(output_dir):
    """What Ctrl-C leaves: the run's last checkpoint to resume from, or nothing saved yet (tokenizing, say)."""
    if list_checkpoints(output_dir):
        return f"The run's last checkpoint is in {output_dir}: run the same command to resume."
    return "Nothing was saved yet: run the same command to start again."


def main(argv=None):
    argv, debug = split_debug(argv)
    settings = parse_args(argv)

    def body():
        start_tensorflow()
        from elita_tf.training.loop import train

        train(settings)
        return 0

    return run_command("elita-train", body, debug, resume_hint=lambda: resume_hint(settings.output_dir))


if __name__ == "__main__":
    sys.exit(main())
