"""`elita-recall`: what each design can recall, trained on multi-query associative recall (MQAR), one table and plot.

    elita-recall --output-dir runs/recall
    elita-recall --output-dir runs/recall --architectures elita transformer --widths 64 128
    KERAS_BACKEND=jax elita-recall --output-dir runs/zoology --protocol zoology
    elita-recall --output-dir runs/recall-quick --quick

Zoology's figure 2 (`elita_tf.training.recall`), two ways. `--protocol cpu` (the default) at CPU
size: every architecture at width 64 with 2 layers, on the tasks of sequence length 64 with 4 pairs
and 128 with 8, at learning rates 4.6e-4, 1e-3 and 2.2e-3, each as it is, on new sequences every epoch.
`--protocol zoology` as Zoology's: its model (no feed-forward network, tied embeddings, dropout 0.1,
learned positions for attention alone) and data (vocabulary 8,192, 100,000 fixed training sequences,
3,000 test, zeros between the queries, batches of 512 to 64 by length), widths {64, ..., 512}, tasks
64:4 128:8 256:16 and its four learning rates: a GPU's grid. A cell's figure is the best of its
learning-rate sweep. Any Keras backend runs it (`KERAS_BACKEND`), JAX and PyTorch without TensorFlow.
Finished cells are kept in OUTPUT_DIR, and a cell cut short keeps its last epoch: run the same
command to resume. `--quick` is a grid of seconds (two designs, one tiny task) for CI. The flags are
`RecallSettings`' fields.
"""

import dataclasses
import sys

# No TensorFlow until the arguments are parsed: `--help` and a bad flag answer at once.
from elita_tf.checks import check_non_negative_number
from elita_tf.cli.errors import DEBUG_HELP, ArgumentParser, run_command, split_debug
from elita_tf.cli.flags import add_flags
from elita_tf.cli.quiet import start_tensorflow
from elita_tf.training.recall_settings import DESIGNS, QUICK, ZOOLOGY, RecallSettings

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
    parser.add_argument(
        "--quick", action="store_true",
        help=f"A grid of seconds, for CI: its own defaults ({quick}), under either --protocol.",
    )
    parser.add_argument(
        "--time-limit", type=float, metavar="SECONDS",
        help="Start no cell after this many seconds; the report covers the finished cells (0: the report of what is "
        "there, nothing trained). The same command again goes on with the rest.",
    )
    add_flags(parser, RecallSettings, defaults=False)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    given = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(RecallSettings)
        if getattr(args, field.name, None) is not None
    }
    defaults = (ZOOLOGY if args.protocol == "zoology" else {}) | (QUICK if args.quick else {})
    try:
        settings = RecallSettings(**(defaults | given))
        if args.time_limit is not None:
            check_non_negative_number("time_limit", args.time_limit)
    except ValueError as error:
        parser.error(str(error))
    architectures = args.architectures or (QUICK_ARCHITECTURES if args.quick else list(DESIGNS))
    from elita_tf.models.architectures import architecture  # no TensorFlow

    try:
        for name in architectures:
            architecture(name)
    except ValueError as error:
        parser.error(str(error))
    return args.output_dir, architectures, settings, args.time_limit


def main(argv=None):
    argv, debug = split_debug(argv)
    output_dir, architectures, settings, time_limit = parse_args(argv)

    def body():
        try:
            start_tensorflow()
        except ImportError:  # not installed: JAX and PyTorch train the cells without it
            pass
        from elita_tf.training.recall import recall_grid

        print(f"elita-recall: {', '.join(architectures)}; {settings}", flush=True)
        recall_grid(output_dir, architectures, settings, lambda line: print(line, flush=True), time_limit)
        print(f"elita-recall: wrote {output_dir}/recall.md, recall.json and recall.png", flush=True)
        return 0

    resume = (
        f"Run the same command to resume: finished cells in {output_dir}/cells are kept, and a cell cut short "
        "goes on from its last epoch."
    )
    return run_command("elita-recall", body, debug, resume_hint=resume)


if __name__ == "__main__":
    sys.exit(main())
