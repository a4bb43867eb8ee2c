"""`elita-evaluate`: a run's loss and perplexity on a split of its data or on any text, and its loss by position.

    elita-evaluate --run-dir runs/compare/elita/seed-0 --split test --quantize int8
    elita-evaluate --run-dir runs/compare/elita/seed-0 --split test --litert elita.tflite
    elita-evaluate --run-dir runs/compare/elita/seed-0 --split test --sequence-length 4096 --output elita-4k.json
    elita-evaluate --run-dir runs/compare/elita/seed-0 --split test --sequence-length 4096 --carry-state
    elita-evaluate --run-dir runs/compare/elita/seed-0 --split test --sequence-length 4096 --position-mode clamped

Every flag is a field of `EvaluateSettings` (or, for other text, of its `CorpusSettings`); the
library function is `elita_tf.training.evaluate`. Prints one JSON object on stdout
(progress goes to stderr).
"""

import contextlib
import dataclasses
import json
import os
import sys

# Only modules without TensorFlow until the arguments are parsed: `--help` and a bad flag answer at once.
from elita_tf.cli.errors import DEBUG_HELP, ArgumentParser, run_command
from elita_tf.cli.flags import add_flags
from elita_tf.cli.quiet import start_tensorflow
from elita_tf.data.corpus_settings import CorpusSettings
from elita_tf.data.text_files import TextCorpus, data_kind
from elita_tf.training.evaluate_settings import EvaluateSettings

# CorpusSettings' fields that other text has no use for (it is scored whole, or by --split), or that
# EvaluateSettings has too (where the run's own data is read).
_NOT_CORPUS_FLAGS = ("validation_data", "test_data", "holdout_fraction", "data_dir", "tfds_dir")


def main(argv=None):
    parser = ArgumentParser(prog="elita-evaluate", description=__doc__.split("\n\n")[0])
    add_flags(parser, EvaluateSettings, exclude=("corpus",))
    # Other text, instead of the run's own: text files and JSON Lines are scored whole, WikiText or TFDS by --split.
    add_flags(parser, CorpusSettings, exclude=_NOT_CORPUS_FLAGS, defaults=False, default_help="the run's")
    parser.add_argument("--output", help="also write the JSON to this file")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    given = vars(args)
    corpus_flags = [f.name for f in dataclasses.fields(CorpusSettings) if f.name not in _NOT_CORPUS_FLAGS]
    try:
        corpus = None
        if args.data is not None:
            corpus_fields = {name: given[name] for name in corpus_flags if given[name] is not None}
            corpus = CorpusSettings(**corpus_fields, data_dir=args.data_dir, tfds_dir=args.tfds_dir)
            if data_kind(corpus.data) in ("text", "jsonl"):
                TextCorpus(corpus)  # the files exist
        elif any(given[name] is not None for name in corpus_flags):
            parser.error("--document-separator and --text-field describe --data: give --data too.")
        own = {f.name: given[f.name] for f in dataclasses.fields(EvaluateSettings) if f.name != "corpus"}
        settings = EvaluateSettings(**own, corpus=corpus)
    except ValueError as error:
        parser.error(str(error))
    if args.output:  # before any work: an evaluation is not lost to a path that cannot be written
        folder = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            parser.error(f"cannot write --output {args.output}: {folder} is not a writable directory")

    def body():
        start_tensorflow()
        from elita_tf.training import evaluate  # TensorFlow, once the arguments are parsed
        from elita_tf.training.run_directory import write_atomically

        # Progress goes to stderr: stdout carries the JSON alone.
        with contextlib.redirect_stdout(sys.stderr):
            result = evaluate(settings)
        text = json.dumps(result, indent=2)
        print(text)
        if args.output:
            write_atomically(args.output, text + "\n")
        return 0

    return run_command("elita-evaluate", body, args.debug)


if __name__ == "__main__":
    sys.exit(main())
