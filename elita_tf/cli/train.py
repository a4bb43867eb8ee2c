"""`elita-train`: train (or resume) a language model of a named architecture on WikiText or your own text.

    elita-train --architecture elita --output-dir runs/elita --epochs 3
    elita-train --data "my-texts/*.txt" --output-dir runs/mine
    elita-train --data corpus.jsonl --text-field body --output-dir runs/jsonl
    elita-train --data tfds:lm1b --output-dir runs/lm1b
    elita-train --init-from runs/mine --data "new-texts/*.txt" --lora-rank 8 --output-dir runs/tuned

Every flag is a field of `elita_tf.training.TrainSettings`; the loop is `elita_tf.training.train`.
"""

import argparse
import dataclasses
import glob
import os
import sys

# Only modules without TensorFlow until the arguments are parsed: `--help` and a bad flag answer at once.
from elita_tf.cli.errors import DEBUG_HELP, ArgumentParser, run_command, split_debug
from elita_tf.data.sources import CONFIG_NAMES, DATA_DIR_ENV, split_files
from elita_tf.data.text_files import DOCUMENTS, TextCorpus, data_kind
from elita_tf.models.architectures import ARCHITECTURES, POSITION_MODES
from elita_tf.training.settings import DTYPE_POLICIES, OPTIMIZERS, STRATEGIES, TrainSettings

_HELP = {
    "architecture": f"one of {sorted(ARCHITECTURES)}",
    "data": f"the training text: a WikiText config {CONFIG_NAMES}, tfds:NAME[/CONFIG], a .jsonl file, or a glob "
    "of plain-text files (quote it)",
    "data_dir": f"local WikiText directory (wiki.*.tokens or .raw); defaults to ${DATA_DIR_ENV}; else downloads",
    "validation_data": "text files or .jsonl for the validation split (default: held out of --data)",
    "test_data": "text files or .jsonl for the test split (default: held out of --data)",
    "documents": "plain-text files: each file is a document, or blank lines separate documents",
    "text_field": "JSON Lines and TFDS: the field holding the text",
    "holdout_fraction": "share of --data's documents held out for each split it does not provide",
    "tokenizer_sample_bytes": "SentencePiece trains on a seeded sample of at most this much train text",
    "tokenizer_from": "reuse this run directory's or preset's SentencePiece model (and its vocabulary size)",
    "init_from": "fine-tune: start from this run directory's or preset's weights, tokenizer and architecture",
    "lora_rank": "with --init-from: train LoRA adapters of this rank on every projection, nothing else",
    "merge_lora": "with --lora-rank: the run's preset holds the merged weights instead of the adapters",
    "tfds_dir": "where tensorflow-datasets keeps prepared data",
    "max_steps": "stop after this many steps in all (a token budget)",
    "checkpoint_every": "steps between checkpoints",
    "keep_checkpoints": "how many of the newest checkpoints to keep",
    "force_new": "discard the run already in --output-dir instead of resuming it",
    "eval_batches": "cap on validation/test batches (default: all)",
    "verbose": "Keras fit verbosity (1: progress bar)",
    "dtype_policy": "Keras dtype policy of the layers (weights stay float32)",
    "position_mode": "ELiTA's positions past the training length: the sinusoids run on (fixed) or hold the last "
    "trained position (clamped); length is the original's (moves with the sequence length, no decoding). "
    "Default: the run's own when resuming, else the architecture's (elita: clamped, fixed with --carry-state)",
    "carry_state": "truncated backpropagation through time: each batch row reads its own stream, every block's "
    "state carries over from step to step and restarts at each article (elita; linear and additive have learned "
    "positions)",
    "pack_documents": "windows hold documents back to back, and no position sees another document in any block; "
    "the loss leaves out each document's first token",
}
_CHOICES = {
    "documents": DOCUMENTS,
    "strategy": STRATEGIES,
    "optimizer": OPTIMIZERS,
    "dtype_policy": DTYPE_POLICIES,
    "position_mode": POSITION_MODES,
}


def add_settings_flags(parser, exclude=(), defaults=True):
    """One flag for each `TrainSettings` field not in `exclude`.

    With `defaults=False` every flag is left unset (None) unless given and
    none is required: `elita-compare` passes on only what was given.
    """
    for field in dataclasses.fields(TrainSettings):
        if field.name in exclude:
            continue
        flag = "--" + field.name.replace("_", "-")
        if field.type is bool:
            parser.add_argument(flag, action="store_true", help=_HELP.get(field.name))
            continue
        default = None if field.default is dataclasses.MISSING else field.default
        kind = {"int": int, "float": float}.get(getattr(field.type, "__name__", ""), str)
        parser.add_argument(
            flag,
            type=kind,
            default=default if defaults else None,
            required=defaults and field.default is dataclasses.MISSING,
            choices=_CHOICES.get(field.name),
            help=_HELP.get(field.name),
        )
    return parser


def parse_args(argv=None):
    """`TrainSettings` from command-line arguments; a bad value exits with its message."""
    parser = ArgumentParser(prog="elita-train", description=__doc__.split("\n\n")[0])
    add_settings_flags(parser)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    try:
        settings = TrainSettings(**{k: v for k, v in vars(parser.parse_args(argv)).items() if k != "debug"})
    except ValueError as error:
        parser.error(str(error))
    if settings.init_from is not None:
        from elita_tf.training.loop import MODEL_FIELDS, init_from_settings  # reads the model: TensorFlow

        # The flags given on the command line, defaults aside: those must agree with the model.
        given_flags = vars(add_settings_flags(argparse.ArgumentParser(), defaults=False).parse_known_args(argv)[0])
        try:
            settings = init_from_settings(settings, [key for key in MODEL_FIELDS if given_flags[key] is not None])
        except (FileNotFoundError, ValueError) as error:
            parser.error(str(error))
    if settings.tokenizer_from is not None:
        from elita_tf.training.loop import tokenizer_from_settings  # reads the tokenizer: TensorFlow

        given_flags = vars(add_settings_flags(argparse.ArgumentParser(), defaults=False).parse_known_args(argv)[0])
        try:
            settings = tokenizer_from_settings(settings, given_flags["vocabulary_size"] is not None)
        except (FileNotFoundError, ValueError) as error:
            parser.error(str(error))
    if settings.carry_state:
        from elita_tf.training.loop import check_carry_state  # needs the model's defaults: TensorFlow

        try:
            check_carry_state(settings)
        except ValueError as error:
            parser.error(str(error))
    try:  # the data's files exist (a full check of the text comes before the run writes anything)
        if data_kind(settings.data) == "wikitext":
            if settings.data_dir or os.environ.get(DATA_DIR_ENV):
                split_files(settings.data_dir or os.environ[DATA_DIR_ENV], settings.data)
        elif data_kind(settings.data) != "tfds":
            TextCorpus(
                settings.data,
                settings.validation_data,
                settings.test_data,
                documents=settings.documents,
                text_field=settings.text_field,
            )
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    return settings


def resume_hint(output_dir):
    """What Ctrl-C leaves: the run's last checkpoint to resume from, or nothing saved yet (tokenizing, say)."""
    # The names `elita_tf.training.checkpoints` gives, globbed: that module loads TensorFlow. Eight digits
    # leave out a half-written `step-*.keras.tmp.keras`.
    if glob.glob(os.path.join(glob.escape(output_dir), "checkpoints", "step-" + "[0-9]" * 8 + ".keras")):
        return f"The run's last checkpoint is in {output_dir}: run the same command to resume."
    return "Nothing was saved yet: run the same command to start again."


def main(argv=None):
    argv, debug = split_debug(argv)
    settings = parse_args(argv)

    def body():
        from elita_tf.training.loop import train

        train(settings)
        return 0

    return run_command("elita-train", body, debug, resume_hint=lambda: resume_hint(settings.output_dir))


if __name__ == "__main__":
    sys.exit(main())
