"""`elita-recall`: what each design can recall, trained on multi-query associative recall (MQAR), one table and plot.

    elita-recall --output-dir runs/recall
    elita-recall --output-dir runs/recall --architectures elita transformer --widths 64 128
    elita-recall --output-dir runs/recall-quick --quick

Zoology's figure 2 at CPU size (`elita_tf.training.recall`): every architecture at widths
{64, 128, 256} with 2 layers, on the tasks of sequence length 64 with 4 and 16 pairs and 256 with 16
and 64, the best of a learning-rate sweep, on any Keras backend (`KERAS_BACKEND`). Finished cells
are kept in OUTPUT_DIR, and a cell cut short keeps its last epoch: run the same command to resume.
`--quick` is a grid of seconds (two designs, one tiny task) for CI. The flags are `RecallSettings`'
fields.
"""

import dataclasses
import sys

# No TensorFlow until the arguments are parsed: `--help` and a bad flag answer at once.
from elita_tf.cli.errors import DEBUG_HELP, ArgumentParser, run_command, split_debug
from elita_tf.cli.flags import add_flags
from elita_tf.cli.quiet import start_tensorflow
from elita_tf.training.recall_settings import DESIGNS, QUICK, RecallSettings

QUICK_ARCHITECTURES = ["elita", "transformer"]


def parse_args(argv=None):
    """`(output_dir, architectures, RecallSettings)` from the command line; a bad value exits with its message."""
    parser = ArgumentParser(prog="elita-recall", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--output-dir",
        required=True,
        help="Where the cells, the table (recall.md), the json and the plot go. Finished cells there are kept and "
        "not trained again; a cell trained with other settings is refused.",
    )
    parser.add_argument(
        "--architectures",
        nargs="+",
        help=f"Names of elita_tf.models.ARCHITECTURES. Default: the seven designs, {' '.join(DESIGNS)} (with "
        "--quick: elita transformer).",
    )
    def flag_value(value):  # as the flag takes it: `16`, `16:2`
        return " ".join(":".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in value)

    quick = ", ".join(
        f"--{name.replace('_', '-')} {flag_value(v if isinstance(v, tuple) else (v,))}" for name, v in QUICK.items()
    )
    parser.add_argument("--quick", action="store_true", help=f"A grid of seconds, for CI: its own defaults ({quick}).")
    add_flags(parser, RecallSettings, defaults=False)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    given = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(RecallSettings)
        if getattr(args, field.name, None) is not None
    }
    try:
        settings = RecallSettings(**((QUICK if args.quick else {}) | given))
    except ValueError as error:
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
