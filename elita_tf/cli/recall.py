"""`elita-recall`: what each design can recall, trained on multi-query associative recall (MQAR), one table and plot.

    elita-recall --output-dir runs/recall
    elita-recall --output-dir runs/recall --architectures elita transformer --widths 64 128
    elita-recall --output-dir runs/recall-quick --quick

Zoology's figure 2 at CPU size (`elita_tf.training.recall`): every architecture at widths
{64, 128, 256} with 2 layers, on sequence length 64 with 4 and 16 pairs and 256 with 16 and 64,
the best of a learning-rate sweep. Finished cells are kept in OUTPUT_DIR, and a cell cut short keeps
its last epoch: run the same command to resume. `--quick` is a grid of seconds (two designs, one
tiny setting) for CI.
"""

import argparse
import dataclasses
import sys

# No TensorFlow until the arguments are parsed: `--help` and a bad flag answer at once.
from elita_tf.cli.errors import DEBUG_HELP, ArgumentParser, run_command, split_debug
from elita_tf.cli.quiet import start_tensorflow
from elita_tf.training.recall import DESIGNS, QUICK, RecallSettings

QUICK_ARCHITECTURES = ["elita", "transformer"]


def _setting(text):
    """`"64:4"` -> `(64, 4)`: a sequence length and its number of pairs."""
    try:
        sequence_length, num_pairs = (int(part) for part in text.split(":"))
    except ValueError:
        message = f"a setting is SEQUENCE_LENGTH:NUM_PAIRS, as 64:4. Received: {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    return sequence_length, num_pairs


def parse_args(argv=None):
    """`(output_dir, architectures, RecallSettings)` from the command line; a bad value exits with its message."""
    default = {field.name: field.default for field in dataclasses.fields(RecallSettings)}
    parser = ArgumentParser(prog="elita-recall", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument(
        "--architectures",
        nargs="+",
        help=f"default: the seven designs, {' '.join(DESIGNS)} (--quick: elita transformer)",
    )
    parser.add_argument("--quick", action="store_true", help="a grid of seconds, for CI: its own tiny defaults")
    parser.add_argument("--widths", nargs="+", type=int, help=f"default: {' '.join(map(str, default['widths']))}")
    parser.add_argument(
        "--settings",
        nargs="+",
        type=_setting,
        help="SEQUENCE_LENGTH:NUM_PAIRS each; default: " + " ".join(f"{t}:{p}" for t, p in default["settings"]),
    )
    parser.add_argument(
        "--learning-rates",
        nargs="+",
        type=float,
        help=f"the sweep, the best reported; default: {' '.join(map(str, default['learning_rates']))}",
    )
    for name, kind in (
        ("vocabulary_size", int),
        ("train_examples", int),
        ("test_examples", int),
        ("epochs", int),
        ("batch_size", int),
        ("num_layers", int),
        ("num_heads", int),
        ("weight_decay", float),
        ("seed", int),
    ):
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=kind, help=f"default: {default[name]}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    given = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(RecallSettings)
        if getattr(args, field.name, None) is not None
    }
    given = {name: tuple(value) if isinstance(value, list) else value for name, value in given.items()}
    try:
        settings = RecallSettings(**((QUICK if args.quick else {}) | given))
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    architectures = args.architectures or (QUICK_ARCHITECTURES if args.quick else list(DESIGNS))
    from elita_tf.models.architectures import architecture  # no TensorFlow

    try:
        for name in architectures:
            architecture(name)
    except ValueError as error:
        parser.error(str(error))
    return args.output_dir, architectures, settings


def main(argv=None):
    argv, debug = split_debug(argv)
    output_dir, architectures, settings = parse_args(argv)

    def body():
        start_tensorflow()
        from elita_tf.training.recall import recall_grid

        print(f"elita-recall: {', '.join(architectures)}; {settings}", flush=True)
        recall_grid(output_dir, architectures, settings, log=lambda line: print(line, flush=True))
        print(f"elita-recall: wrote {output_dir}/recall.md, recall.json and recall.png", flush=True)
        return 0

    resume = (
        f"Run the same command to resume: finished cells in {output_dir}/cells are kept, and a cell cut short "
        "goes on from its last epoch."
    )
    return run_command("elita-recall", body, debug, resume_hint=resume)


if __name__ == "__main__":
    sys.exit(main())
