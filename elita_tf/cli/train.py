"""`elita-train`: train (or resume) a language model of a named architecture on WikiText.

    elita-train --architecture elita --output-dir runs/elita --epochs 3

Every flag is a field of `elita_tf.training.TrainSettings`; the loop is `elita_tf.training.train`.
"""

import argparse
import dataclasses
import os
import sys

# Only modules without TensorFlow until the arguments are parsed: `--help` and a bad flag answer at once.
from elita_tf.cli.errors import DEBUG_HELP, run_command, split_debug
from elita_tf.data.sources import CONFIG_NAMES, DATA_DIR_ENV, split_files
from elita_tf.models.architectures import ARCHITECTURES, POSITION_MODES
from elita_tf.training.settings import DTYPE_POLICIES, OPTIMIZERS, STRATEGIES, TrainSettings

_HELP = {
    "architecture": f"one of {sorted(ARCHITECTURES)}",
    "data_dir": f"local WikiText directory (wiki.*.tokens or .raw); defaults to ${DATA_DIR_ENV}; else downloads",
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
}
_CHOICES = {
    "dataset": CONFIG_NAMES,
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
        if field.name == "data_dir":
            default = os.environ.get(DATA_DIR_ENV) or None
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
    parser = argparse.ArgumentParser(prog="elita-train", description=__doc__.split("\n\n")[0])
    add_settings_flags(parser)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    try:
        settings = TrainSettings(**{k: v for k, v in vars(parser.parse_args(argv)).items() if k != "debug"})
    except ValueError as error:
        parser.error(str(error))
    if settings.carry_state:
        from elita_tf.training.loop import check_carry_state  # needs the model's defaults: TensorFlow

        try:
            check_carry_state(settings)
        except ValueError as error:
            parser.error(str(error))
    if settings.data_dir is not None:
        try:
            split_files(settings.data_dir, settings.dataset)
        except FileNotFoundError as error:
            parser.error(str(error))
    return settings


def main(argv=None):
    argv, debug = split_debug(argv)
    settings = parse_args(argv)
    resume = f"The run's last checkpoint is in {settings.output_dir}: run the same command to resume."

    def body():
        from elita_tf.training.loop import train

        train(settings)
        return 0

    return run_command("elita-train", body, debug, resume_hint=resume)


if __name__ == "__main__":
    sys.exit(main())
