"""`elita-evaluate`: a trained run's loss and perplexity on a WikiText split, in float or int8.

    elita-evaluate --run-dir runs/compare/elita/seed-0 --split test --quantize int8
    elita-evaluate --run-dir runs/compare/elita/seed-0 --split test --litert elita.tflite

The library function is `elita_tf.training.evaluate.evaluate`. Prints one JSON object on stdout
(progress goes to stderr).
"""

import argparse
import contextlib
import json
import os
import sys

from elita_tf.data.wikitext import DATA_DIR_ENV
from elita_tf.training.evaluate import QUANTIZATIONS, SPLITS, evaluate


def main(argv=None):
    parser = argparse.ArgumentParser(prog="elita-evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="a finished elita-train output directory")
    parser.add_argument("--split", default="test", choices=SPLITS)
    parser.add_argument("--quantize", choices=QUANTIZATIONS, help="evaluate after Keras' quantize(MODE)")
    parser.add_argument("--litert", help="score through this LiteRT file of the run (elita-export --format litert)")
    parser.add_argument(
        "--data-dir", default=os.environ.get(DATA_DIR_ENV) or None, help=f"defaults to ${DATA_DIR_ENV}; else downloads"
    )
    parser.add_argument("--tfds-dir", help="where tensorflow-datasets keeps prepared data")
    parser.add_argument("--batch-size", type=int, help="defaults to the run's")
    parser.add_argument("--eval-batches", type=int, help="a cap on batches")
    args = parser.parse_args(argv)
    for name in ("batch_size", "eval_batches"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"`{name}` must be a positive integer. Received: {name}={value}")
    try:
        # Progress goes to stderr: stdout carries the JSON alone.
        with contextlib.redirect_stdout(sys.stderr):
            result = evaluate(
                args.run_dir,
                split=args.split,
                data_dir=args.data_dir,
                tfds_dir=args.tfds_dir,
                batch_size=args.batch_size,
                eval_batches=args.eval_batches,
                quantize=args.quantize,
                litert=args.litert,
                verbose=1,
            )
    except (FileNotFoundError, ValueError, ImportError) as error:
        parser.error(str(error))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
