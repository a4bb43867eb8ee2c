"""`elita-export`: a training run's newest intact checkpoint as a SavedModel for serving.

    elita-export --run-dir runs/compare/elita/seed-0 --output exported/elita

The library function is `elita_tf.export.export_saved_model`; its signatures are described there.
"""

import argparse
import json
import os
import sys

import keras

from elita_tf.export import export_saved_model
from elita_tf.models.config import DecoderConfig
from elita_tf.training.checkpoints import CorruptCheckpointError, latest_checkpoint


def main(argv=None):
    parser = argparse.ArgumentParser(prog="elita-export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="an elita-train output directory")
    parser.add_argument("--output", required=True, help="SavedModel directory to write")
    args = parser.parse_args(argv)
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
    export_saved_model(model, config, proto, args.output)
    print(f"SavedModel written to {args.output} (signatures: serving_default, generate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
