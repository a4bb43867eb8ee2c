"""`elita-export`: a training run's newest intact checkpoint as a SavedModel for serving, or a LiteRT file.

    elita-export --run-dir runs/compare/elita/seed-0 --output exported/elita
    elita-export --run-dir runs/compare/elita/seed-0 --format litert --output elita.tflite [--quantize int8]

The library functions are `elita_tf.export.export_saved_model` and
`elita_tf.litert.export_litert`; their signatures are described there.
"""

import argparse
import json
import os
import sys

import keras

from elita_tf.export import export_saved_model
from elita_tf.litert import export_litert
from elita_tf.models.config import DecoderConfig
from elita_tf.training.checkpoints import CorruptCheckpointError, latest_checkpoint


def main(argv=None):
    parser = argparse.ArgumentParser(prog="elita-export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="an elita-train output directory")
    parser.add_argument("--output", required=True, help="the SavedModel directory or .tflite file to write")
    parser.add_argument(
        "--format",
        default="saved_model",
        choices=["saved_model", "litert"],
        help="saved_model (serving) or litert (on-device: prefill and decode signatures)",
    )
    parser.add_argument("--quantize", choices=["int8"], help="litert only: int8 weights (dynamic-range)")
    args = parser.parse_args(argv)
    if args.quantize and args.format != "litert":
        parser.error(f"--quantize applies to --format litert. Received: --format {args.format}")
    files = {name: os.path.join(args.run_dir, name) for name in ["run.json", "sentencepiece.model"]}
    missing = [path for path in files.values() if not os.path.exists(path)]
    try:
        checkpoint = latest_checkpoint(args.run_dir)
    except CorruptCheckpointError as error:
        parser.error(str(error))
    if checkpoint is None:
        missing.append(os.path.join(args.run_dir, "checkpoints", "step-*.keras"))
    if missing:
        parser.error(f"the run directory lacks {', '.join(missing)}")
    model = keras.models.load_model(checkpoint, compile=False)
    with open(files["run.json"]) as f:
        config = DecoderConfig.from_config(json.load(f)["model"])
    with open(files["sentencepiece.model"], "rb") as f:
        proto = f.read()
    if args.format == "litert":
        export_litert(model, config, args.output, quantize=args.quantize)
        size = os.path.getsize(args.output) / 2**20
        limit = "any length" if config.decode_limit is None else f"up to {config.decode_limit} positions"
        print(f"LiteRT file written to {args.output} ({size:.2f} MiB; signatures: prefill, decode; decodes {limit})")
        return 0
    export_saved_model(model, config, proto, args.output)
    print(f"SavedModel written to {args.output} (signatures: serving_default, generate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
