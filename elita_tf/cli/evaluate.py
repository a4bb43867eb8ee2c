"""`elita-evaluate`: a run's loss and perplexity on a split of its data or on any text, and its loss by position.

    elita-evaluate --run-dir runs/compare/elita/seed-0 --split test --quantize int8
    elita-evaluate --run-dir runs/compare/elita/seed-0 --split test --litert elita.tflite
    elita-evaluate --run-dir runs/compare/elita/seed-0 --split test --window-length 4096 --output elita-4k.json
    elita-evaluate --run-dir runs/compare/elita/seed-0 --split test --window-length 4096 --carry-state
    elita-evaluate --run-dir runs/compare/elita/seed-0 --split test --window-length 4096 --position-mode clamped

The library function is `elita_tf.training.evaluate.evaluate`. Prints one JSON object on stdout
(progress goes to stderr).
"""

import argparse
import contextlib
import dataclasses
import json
import os
import sys

# Only modules without TensorFlow until the arguments are parsed: `--help` and a bad flag answer at once.
from elita_tf.checks import check_sequence_length
from elita_tf.cli.errors import DEBUG_HELP, ArgumentParser, run_command
from elita_tf.cli.flags import add_flags, flag_help
from elita_tf.cli.quiet import start_tensorflow
from elita_tf.data.corpus_settings import CorpusSettings
from elita_tf.data.text_files import SPLITS, TextCorpus, data_kind
from elita_tf.export.settings import QUANTIZATIONS
from elita_tf.layers.options import POSITION_MODES
from elita_tf.settings_fields import check_field, field_named
from elita_tf.training.settings import TrainSettings

# CorpusSettings' fields that other text has no use for: it is scored whole, or by --split.
_NOT_FLAGS = ("validation_data", "test_data", "holdout_fraction")


def _run_flag_help(name, default_help=None):
    """The help of elita-train's flag of the same name (`TrainSettings`' field)."""
    return flag_help(TrainSettings, field_named(TrainSettings, name), default_help)


def main(argv=None):
    parser = ArgumentParser(prog="elita-evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="a finished elita-train output directory")
    parser.add_argument("--split", default="test", choices=SPLITS)
    # Other text, instead of the run's own: its flags are CorpusSettings' (text files and JSON Lines are
    # scored whole, a WikiText config or TFDS dataset by --split); --data-dir and --tfds-dir also locate the run's.
    add_flags(parser, CorpusSettings, exclude=_NOT_FLAGS, defaults=False, default_help="the run's")
    parser.add_argument("--quantize", choices=QUANTIZATIONS, help="evaluate after Keras' quantize(MODE)")
    parser.add_argument("--litert", help="score through this LiteRT file of the run (elita-export --format litert)")
    parser.add_argument("--batch-size", type=int, help=_run_flag_help("batch_size", "the run's"))
    parser.add_argument("--eval-batches", type=int, help=_run_flag_help("eval_batches"))
    parser.add_argument("--window-length", type=int, help="window length N; defaults to the run's --sequence-length")
    parser.add_argument(
        "--carry-state",
        action="store_true",
        help="read the split as one stream, N tokens at a time, carrying every block's decoding state",
    )
    parser.add_argument("--position-mode", choices=POSITION_MODES, help=_run_flag_help("position_mode", "the run's"))
    parser.add_argument(
        "--pack-documents",
        action=argparse.BooleanOptionalAction,
        help=_run_flag_help("pack_documents") + " Default: as the run trained.",
    )
    parser.add_argument("--output", help="also write the JSON to this file")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    try:  # the checks of elita-train's flags of the same names; the window is a sequence length
        for name in ("batch_size", "eval_batches"):
            if getattr(args, name) is not None:
                check_field(TrainSettings, name, getattr(args, name))
        check_sequence_length("window_length", args.window_length, optional=True)
    except ValueError as error:
        parser.error(str(error))
    corpus = None
    if args.data is not None:
        given = {f.name: getattr(args, f.name) for f in dataclasses.fields(CorpusSettings) if f.name not in _NOT_FLAGS}
        try:
            corpus = CorpusSettings(**{name: value for name, value in given.items() if value is not None})
            if data_kind(corpus.data) in ("text", "jsonl"):
                TextCorpus(corpus)  # the files exist
        except ValueError as error:
            parser.error(str(error))
    elif args.document_separator is not None or args.text_field is not None:
        parser.error("--document-separator and --text-field describe --data: give --data too.")
    if args.output:  # before any work: an evaluation is not lost to a path that cannot be written
        folder = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            parser.error(f"cannot write --output {args.output}: {folder} is not a writable directory")

    def body():
        start_tensorflow()
        from elita_tf.training.evaluate import evaluate  # TensorFlow, once the arguments are parsed
        from elita_tf.training.run_directory import write_atomically

        # Progress goes to stderr: stdout carries the JSON alone.
        with contextlib.redirect_stdout(sys.stderr):
            result = evaluate(
                args.run_dir,
                split=args.split,
                corpus=corpus,
                data_dir=args.data_dir,
                tfds_dir=args.tfds_dir,
                batch_size=args.batch_size,
                eval_batches=args.eval_batches,
                quantize=args.quantize,
                litert=args.litert,
                window_length=args.window_length,
                carry_state=args.carry_state,
                position_mode=args.position_mode,
                pack_documents=args.pack_documents,
                verbose=1,
            )
        text = json.dumps(result, indent=2)
        print(text)
        if args.output:
            write_atomically(args.output, text + "\n")
        return 0

    return run_command("elita-evaluate", body, args.debug)


if __name__ == "__main__":
    sys.exit(main())
