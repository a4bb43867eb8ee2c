"""`elita-compare`: train several architectures, each with several seeds, then plot and tabulate.

    elita-compare --architectures elita transformer --seeds 0 1 2 --output-dir runs/compare --epochs 2

The library function is `elita_tf.training.compare.compare`; every other flag is an `elita-train`
flag passed to each run.
"""

import argparse
import sys

from elita_tf.cli.train import add_settings_flags
from elita_tf.training.compare import compare

# Set per run by compare itself.
_PER_RUN = ("output_dir", "architecture", "seed")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="elita-compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--architectures", nargs="+", default=["elita", "transformer"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="train every architecture with each seed")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--plot", help="PNG to write (default: OUTPUT_DIR/ELiTA.png)")
    # The elita-train flags, left unset unless given: each run then takes elita-train's default.
    add_settings_flags(parser, exclude=_PER_RUN, defaults=False)
    return parser, parser.parse_args(argv)


def main(argv=None):
    parser, args = parse_args(argv)
    options = {key: value for key, value in vars(args).items() if value is not None and value is not False}
    fixed = {key: options.pop(key, None) for key in ["architectures", "seeds", "output_dir", "plot"]}
    try:
        compare(fixed["output_dir"], fixed["architectures"], fixed["seeds"], fixed["plot"], **options)
    except ValueError as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
