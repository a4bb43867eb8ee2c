"""`elita-export`: a training run's newest intact checkpoint as a keras-hub preset, a SavedModel or a LiteRT file.

    elita-export --run-dir runs/compare/elita/seed-0 --format preset --output elita-preset
    elita-export --run-dir runs/compare/elita/seed-0 --output exported/elita
    elita-export --run-dir runs/compare/elita/seed-0 --format litert --output elita.tflite [--quantize int8]

A preset holds the model and its tokenizer, nothing of the run (no checkpoints, logs or
manifest): `keras_hub.upload_preset("kaggle://USER/MODEL/keras/VARIANT", "elita-preset")` or
`keras_hub.upload_preset("hf://USER/MODEL", "elita-preset")` publishes it as it is. The library
functions are `ElitaCausalLM.save_to_preset`, `elita_tf.export.export_saved_model` and
`elita_tf.export.export_litert`; their formats are described there. An `--output` that exists is
written over only when it is empty or an earlier export of the same format: nothing else is lost.

The exports are TensorFlow's, and a run of any Keras backend loads there: the command runs Keras
on TensorFlow whatever `KERAS_BACKEND` says.
"""

import json
import os
import subprocess
import sys

# Only modules without TensorFlow until the arguments are parsed: `--help` and a bad flag answer at once.
from elita_tf.cli.errors import DEBUG_HELP, ArgumentParser, run_command
from elita_tf.cli.quiet import start_tensorflow
from elita_tf.export.settings import DEFAULT_MAX_NEW_TOKENS, QUANTIZATIONS, check_max_new_tokens

FORMATS = ("saved_model", "litert", "preset")
_FORMAT_NAMES = {"saved_model": "SavedModel", "litert": "LiteRT", "preset": "keras-hub preset"}


def _is_export(path, format):
    """Whether `path` is what an earlier `elita-export --format FORMAT` wrote."""
    if format == "saved_model":
        return os.path.isfile(os.path.join(path, "saved_model.pb"))
    if format == "preset":
        try:
            with open(os.path.join(path, "config.json")) as f:
                return json.load(f).get("class_name") == "ElitaBackbone"
        except (OSError, ValueError, AttributeError):
            return False
    start_tensorflow()
    from elita_tf.export.litert import read_identity  # the flatbuffer reader: TensorFlow

    try:
        return read_identity(path) is not None
    except Exception:  # a file the flatbuffer reader cannot parse, whatever it raises, is not ours
        return False


def check_output(path, format):
    """Raises ValueError naming `path` unless exporting there overwrites only an earlier export of `format`.

    A preset (`save_to_preset`) and a SavedModel (Keras' `ExportArchive`)
    are written into an existing directory, over the files of the same
    names; a LiteRT file replaces the file. A new path, an empty directory
    or file, and an earlier export of the same format are fine.
    """
    if not os.path.lexists(path):
        return
    if format == "litert":
        if os.path.isfile(path) and (os.path.getsize(path) == 0 or _is_export(path, format)):
            return
    elif os.path.isdir(path) and (not os.listdir(path) or _is_export(path, format)):
        return
    raise ValueError(
        f"--output {path} exists and is not an earlier {_FORMAT_NAMES[format]} export: elita-export writes over "
        f"its own exports only. Choose a new path, or move it away. Received: output={path}"
    )


def _run_on_tensorflow(argv):
    """None once Keras will run on TensorFlow here, else the exit status of this command run again where it does.

    Keras reads `KERAS_BACKEND` once, at its import: before it, setting it
    is enough; after it (a caller that imported Keras on JAX, say), the
    command runs in a process of its own.
    """
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = "tensorflow"
        return None
    import keras

    if keras.config.backend() == "tensorflow":
        return None
    argv = sys.argv[1:] if argv is None else list(argv)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this elita_tf's
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-m", "elita_tf.cli.export", *argv], env=env).returncode


def main(argv=None):
    status = _run_on_tensorflow(argv)
    if status is not None:
        return status
    parser = ArgumentParser(prog="elita-export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="an elita-train output directory")
    parser.add_argument("--output", required=True, help="the directory (preset, SavedModel) or .tflite file to write")
    parser.add_argument(
        "--format",
        default="saved_model",
        choices=FORMATS,
        help="saved_model (serving), litert (on-device: prefill and decode signatures) or preset (keras-hub)",
    )
    parser.add_argument("--quantize", choices=QUANTIZATIONS, help="litert only: int8 weights (dynamic-range)")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=DEFAULT_MAX_NEW_TOKENS,
        help="saved_model only: the most tokens one generate request may ask for (default %(default)s)",
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    if args.quantize and args.format != "litert":
        parser.error(f"--quantize applies to --format litert. Received: --format {args.format}")
    try:  # before the model loads: seconds, and nothing to write over
        check_max_new_tokens(args.max_new_tokens)
        check_output(args.output, args.format)
    except ValueError as error:
        parser.error(str(error))
    start_tensorflow()
    from elita_tf.training.checkpoints import CorruptCheckpointError, load_run_model  # TensorFlow, once checked

    try:
        causal_lm = load_run_model(args.run_dir)
    except (FileNotFoundError, CorruptCheckpointError) as error:
        parser.error(str(error))

    def body():
        from elita_tf.export import export_litert, export_saved_model

        if args.format == "preset":
            causal_lm.save_to_preset(args.output)
            print(f"keras-hub preset written to {args.output}: ElitaCausalLM.from_preset({args.output!r})")
            return 0
        if args.format == "litert":
            export_litert(causal_lm, args.output, quantize=args.quantize)
            size = os.path.getsize(args.output) / 2**20
            limit = causal_lm.backbone.decode_limit
            reach = "any length" if limit is None else f"up to {limit} positions"
            print(f"LiteRT file written to {args.output} ({size:.2f} MiB; signatures prefill, decode; decodes {reach})")
            return 0
        export_saved_model(causal_lm, args.output, max_new_tokens=args.max_new_tokens)
        print(
            f"SavedModel written to {args.output} (signatures: serving_default, generate; generate takes at most "
            f"{args.max_new_tokens} new tokens). Load it with elita_tf.export.load_saved_model({args.output!r}), "
            "or import tensorflow_text before tf.saved_model.load: its tokenizer's ops come from there."
        )
        return 0

    return run_command("elita-export", body, args.debug)


if __name__ == "__main__":
    sys.exit(main())
