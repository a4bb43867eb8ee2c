"""Command-line flags made from the settings dataclasses: one flag a field, one help text a field.

`elita-train` and `elita-compare` take `TrainSettings` and its `CorpusSettings` as flags, and
`elita-evaluate` the `CorpusSettings` of other text: every flag is the field of that name.
"""

import dataclasses

from elita_tf.data.sources import CONFIG_NAMES, DATA_DIR_ENV
from elita_tf.data.text_files import DOCUMENT_SEPARATORS
from elita_tf.layers.options import POSITION_MODES
from elita_tf.models.architectures import ARCHITECTURES, MODEL_SIZES
from elita_tf.training.settings import DTYPE_POLICIES, OPTIMIZERS, STRATEGIES

HELP = {
    "architecture": f"one of {sorted(ARCHITECTURES)}",
    "data": f"the text: a WikiText config {CONFIG_NAMES}, tfds:NAME[/CONFIG], a .jsonl or .ndjson file, or a "
    "glob of plain-text files (quote it)",
    "data_dir": f"local WikiText directory (wiki.*.tokens or .raw); defaults to ${DATA_DIR_ENV}; else downloads",
    "tfds_dir": "where tensorflow-datasets keeps prepared data",
    "validation_data": "text files or .jsonl for the validation split (default: held out of --data)",
    "test_data": "text files or .jsonl for the test split (default: held out of --data)",
    "document_separator": "plain-text files: each file is a document, or blank lines separate documents",
    "text_field": "JSON Lines and TFDS: the field holding the text",
    "holdout_fraction": "share of --data's documents held out for each split it does not provide",
    "tokenizer_sample_bytes": "SentencePiece trains on a seeded sample of at most this much train text",
    "tokenizer_from": "reuse this run directory's or preset's SentencePiece model (and its vocabulary size)",
    "size": "the model's width, depth and heads (--hidden-dim, --num-layers, --num-heads, --head-dim override it)",
    "hidden_dim": "model width (default: the --size's)",
    "num_layers": "blocks (default: the --size's)",
    "num_heads": "heads per attention layer (default: the --size's)",
    "head_dim": "width per head (default: the --size's)",
    "dropout": "residual dropout (default: the backbone's, 0)",
    "init_from": "fine-tune: start from this run directory's or preset's weights, tokenizer and architecture",
    "lora_rank": "with --init-from: train LoRA adapters of this rank on every projection, nothing else",
    "merge_lora": "with --lora-rank: the run's preset holds the merged weights instead of the adapters",
    "max_steps": "stop after this many steps in all (a token budget)",
    "checkpoint_every": "steps between checkpoints",
    "keep_checkpoints": "how many of the newest checkpoints to keep",
    "force_new": "discard the run already in --output-dir instead of resuming it",
    "eval_batches": "cap on validation/test batches (default: all)",
    "verbose": "Keras fit verbosity (1: progress bar)",
    "dtype_policy": "Keras dtype policy of the layers (weights stay float32)",
    "position_mode": "ELiTA's positions past the training length: the sinusoids run on (fixed) or hold the last "
    "trained position (clamped); length is the original's (moves with the sequence length, no decoding). "
    "Default: the run's own when resuming, else the architecture's (elita: clamped, fixed with --carry-state)",
    "carry_state": "truncated backpropagation through time: each batch row reads its own stream, every block's "
    "state carries over from step to step and restarts at each article (elita; linear and additive have learned "
    "positions)",
    "pack_documents": "windows hold documents back to back, and no position sees another document in any block; "
    "the loss leaves out each document's first token",
}
CHOICES = {
    "document_separator": DOCUMENT_SEPARATORS,
    "strategy": STRATEGIES,
    "optimizer": OPTIMIZERS,
    "dtype_policy": DTYPE_POLICIES,
    "position_mode": POSITION_MODES,
    "size": tuple(MODEL_SIZES),
}


def add_flags(parser, settings_class, exclude=(), defaults=True):
    """One flag for each field of the dataclass `settings_class` not in `exclude` (nested dataclasses: theirs).

    With `defaults=False` every flag is left unset (None) unless given and
    none is required: what was given can then be told from the defaults.
    """
    for field in dataclasses.fields(settings_class):
        if field.name in exclude:
            continue
        if field.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(field.default_factory):
            add_flags(parser, field.default_factory, exclude, defaults)
            continue
        flag = "--" + field.name.replace("_", "-")
        if field.type is bool:
            default = False if defaults else None
            parser.add_argument(flag, action="store_true", default=default, help=HELP.get(field.name))
            continue
        default = None if field.default is dataclasses.MISSING else field.default
        kind = {"int": int, "float": float}.get(getattr(field.type, "__name__", ""), str)
        parser.add_argument(
            flag,
            type=kind,
            default=default if defaults else None,
            required=defaults and field.default is dataclasses.MISSING,
            choices=CHOICES.get(field.name),
            help=HELP.get(field.name),
        )
    return parser
