"""`elita-compare`: train several architectures, each with several seeds, then plot and tabulate.

    elita-compare --architectures elita transformer --seeds 0 1 2 --output-dir runs/compare --epochs 2

The library function is `elita_tf.training.compare.compare`; every flag but `--budget-seconds` and
`--debug` is an `elita-train` flag passed to each run.
"""

import sys

from elita_tf.cli.errors import DEBUG_HELP, ArgumentParser, run_command
from elita_tf.cli.flags import add_flags
from elita_tf.training.settings import TrainSettings, train_settings

# Set per run by compare itself; a comparison trains each architecture from scratch (no fine-tuning).
_PER_RUN = ("output_dir", "architecture", "seed", "init_from", "lora_rank", "merge_lora")


def parse_args(argv=None):
    parser = ArgumentParser(prog="elita-compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--architectures", nargs="+", default=["elita", "transformer"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="train every architecture with each seed")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--plot", help="PNG (or any format of matplotlib's) to write (default: OUTPUT_DIR/ELiTA.png)")
    parser.add_argument(
        "--budget-seconds",
        type=float,
        help="skip a run that would end past this many seconds from the start (never a model's first seed)",
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    # The elita-train flags, left unset unless given: each run then takes elita-train's default.
    add_flags(parser, TrainSettings, exclude=_PER_RUN, defaults=False)
    return parser, parser.parse_args(argv)


def main(argv=None):
    parser, args = parse_args(argv)
    options = {key: value for key, value in vars(args).items() if value is not None and value is not False}
    fixed = {key: options.pop(key, None) for key in ["architectures", "seeds", "output_dir", "plot", "budget_seconds"]}
    fixed["debug"] = options.pop("debug", False)
    try:  # the settings, checked before the first run
        train_settings(output_dir=fixed["output_dir"], **options)
        from elita_tf.training.compare import check_comparison  # matplotlib, once the arguments are parsed

        check_comparison(fixed["output_dir"], fixed["architectures"], fixed["seeds"], fixed["plot"])
    except ValueError as error:
        parser.error(str(error))

    def body():
        from elita_tf.training.compare import compare  # TensorFlow, once the arguments are parsed

        compare(
            fixed["output_dir"],
            fixed["architectures"],
            fixed["seeds"],
            fixed["plot"],
            fixed["budget_seconds"],
            **options,
        )
        return 0

    resume = f"Run the same command to resume: finished runs in {fixed['output_dir']} are kept."
    return run_command("elita-compare", body, bool(fixed["debug"]), resume_hint=resume)


if __name__ == "__main__":
    sys.exit(main())
