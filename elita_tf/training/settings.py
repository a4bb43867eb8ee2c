"""`TrainSettings`: everything one training run takes, checked when it is made."""

import dataclasses

from elita_tf.data.corpus_settings import CorpusSettings
from elita_tf.data.text_files import data_kind
from elita_tf.layers.options import POSITION_MODES
from elita_tf.models.architectures import ARCHITECTURES, DEFAULT_SEQUENCE_LENGTH, MODEL_SIZES

STRATEGIES = ("default", "mirrored", "multiworker")
OPTIMIZERS = ("adam", "normalized-sgd")
DTYPE_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")

# The largest values that reach TensorFlow and SentencePiece intact: shapes and sizes are int32,
# step and batch counts int64, and seeds go to numpy's `np.random.seed`, which takes 32 bits.
_INT32_MAX, _INT64_MAX, _SEED_MAX = 2**31 - 1, 2**63 - 1, 2**32 - 1
# Each integer field of `TrainSettings`: `(least, most)`, checked when the settings are made.
INTEGER_RANGES = {
    "tokenizer_sample_bytes": (1, _INT64_MAX),
    "vocabulary_size": (1, _INT32_MAX),
    "sequence_length": (2, _INT32_MAX),
    "hidden_dim": (1, _INT32_MAX),
    "num_layers": (1, _INT32_MAX),
    "num_heads": (1, _INT32_MAX),
    "head_dim": (1, _INT32_MAX),
    "batch_size": (1, _INT32_MAX),
    "epochs": (1, _INT64_MAX),
    "max_steps": (1, _INT64_MAX),
    "lora_rank": (1, _INT32_MAX),
    "seed": (0, _SEED_MAX),
    "checkpoint_every": (1, _INT64_MAX),
    "keep_checkpoints": (1, _INT64_MAX),
    "eval_batches": (1, _INT64_MAX),
    "verbose": (0, 2),
}
# Those that may be None: the size's value, no cap, no adapters.
_OPTIONAL = ("hidden_dim", "num_layers", "num_heads", "head_dim", "max_steps", "eval_batches", "lora_rank")


def check_integer(name, value, least=1, most=_INT32_MAX):
    """Raises `ValueError` naming `name` unless `value` is an int (not a bool) in `[least, most]`."""
    if isinstance(value, int) and not isinstance(value, bool) and least <= value <= most:
        return
    if isinstance(value, int) and not isinstance(value, bool) and value > most:
        expected = f"at most {most}"
    else:
        expected = {0: "a non-negative integer", 1: "a positive integer"}.get(least, f"an integer >= {least}")
    raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """One training run of an architecture on a corpus, WikiText-2 by default (`elita_tf.training.train`).

    The model's fields carry `ElitaBackbone`'s names (`model_fields`);
    `sequence_length` is the training window `T`, which is also the model's
    `max_sequence_length`. A model field left None takes `size`'s value, or
    `ElitaBackbone`'s default; a fine-tuned run takes the model it starts
    from (`elita_tf.training.model_settings.complete_settings`).

    Attributes:
        output_dir: str. The run directory (see `RunDirectory`).
        architecture: str. One of `elita_tf.models.ARCHITECTURES`. Defaults to `"elita"`.
        corpus: `elita_tf.data.CorpusSettings`. The text and how it is split.
            Defaults to WikiText-2.
        tokenizer_sample_bytes: int. SentencePiece trains on a seeded sample of
            at most this much train text (all of WikiText-2 and -103 fit the
            default). Defaults to `10**9`.
        tokenizer_from: str or None. Reuse the SentencePiece model of a
            finished run directory or keras-hub preset instead of training
            one; the vocabulary size is the tokenizer's
            (`tokenizer_from_settings`).
        size: str. The model's width, depth and heads: a key of
            `elita_tf.models.MODEL_SIZES` (`"seed"`, about 1M parameters;
            `"25m"`; `"100m"`). Defaults to `"seed"`.
        vocabulary_size: int. SentencePiece pieces, the model's vocabulary. Defaults to `5000`.
        sequence_length: int. Training length `T`. Defaults to `DEFAULT_SEQUENCE_LENGTH` (256).
        hidden_dim, num_layers, num_heads, head_dim: int or None. Override `size`'s.
        dropout: float or None. Residual dropout; None is the backbone's default (0).
        batch_size: int. Global batch. Defaults to `128`.
        epochs: int. Defaults to `1`.
        max_steps: int or None. A cap on steps in all (a token budget).
        position_mode: str or None. ELiTA's positions: `"fixed"` (the
            sinusoids run on past the training length), `"clamped"` (every
            later position reads as the last one trained) or `"length"` (the
            original's, moving with the sequence length; no decoding). None
            (the default) takes the stored run's when resuming, else the
            architecture's own (`elita-reference`: `"length"`); a new `elita`
            run gets `"clamped"`, or `"fixed"` with `carry_state`, whose
            positions run on through each article and are trained there
            (`resolve_position_mode`).
        optimizer: str. `"adam"` (ELiTA's: `min(1e-3, 1e-2 / sqrt(step))`,
            beta1 0.9, beta2 0.99) or `"normalized-sgd"` (3Lin's: every
            matrix moves by 0.1 in norm per step, linearly to 0 over the
            last tenth of the run). Defaults to `"adam"`.
        dtype_policy: str. `"float32"`, or Keras' `"mixed_bfloat16"` or
            `"mixed_float16"`: float32 weights, the layers computing in 16
            bits (the recurrent states, the loss and the head stay float32).
            Defaults to `"float32"`.
        init_from: str or None. Fine-tuning: start from the weights, tokenizer
            and architecture of a trained model (a finished run directory or a
            keras-hub preset). Its architecture wins: a model field given that
            disagrees with it is an error (`init_from_settings`).
        lora_rank: int or None. With `init_from`, train LoRA adapters of this
            rank on every projection and nothing else (Hu et al. 2021).
        merge_lora: bool. With `lora_rank`, the run's preset holds the merged
            weights `W + A B` (a plain model) instead of the adapters.
        carry_state: bool. Truncated backpropagation through time: each batch
            row reads its own contiguous stream of the split, and every
            block's decoding state carries over from one step to the next,
            restarting at each article (gradients stop at segment
            boundaries; the state is checkpointed). Needs a model whose every
            block keeps a constant-size state, without learned positions
            (`elita`), and the default strategy. Defaults to `False`.
        pack_documents: bool. Windows hold documents back to back, and no
            position sees another document in any block: states and
            buffers restart, softmax masks are block-diagonal, learned
            positions restart. The loss (training and evaluation) leaves out
            each document's first token, which has nothing before it to be
            predicted from. Defaults to `False`.
        seed: int. Data order, tokenizer and weights. Defaults to `0`.
        checkpoint_every: int. Steps between checkpoints. Defaults to `20`.
        keep_checkpoints: int. Newest checkpoints kept. Defaults to `2`.
        force_new: bool. Discard a run already in `output_dir`. Defaults to `False`.
        eval_batches: int or None. A cap on validation and test batches.
        strategy: str. `"default"`, `"mirrored"` or `"multiworker"`.
        verbose: int. Keras `fit` verbosity (1: progress bar). Defaults to `1`.

    Example:
    >>> settings = TrainSettings("runs/elita", architecture="elita", epochs=2)  # doctest: +SKIP
    >>> mine = TrainSettings("runs/mine", corpus=CorpusSettings("my-texts/*.txt"), size="25m")  # doctest: +SKIP
    >>> results = elita_tf.training.train(settings)                       # doctest: +SKIP
    """

    output_dir: str = dataclasses.field(metadata={"local": True})
    architecture: str = "elita"
    corpus: CorpusSettings = dataclasses.field(default_factory=CorpusSettings)
    tokenizer_sample_bytes: int = 10**9
    tokenizer_from: str = None
    size: str = "seed"
    vocabulary_size: int = dataclasses.field(default=5000, metadata={"model": "vocabulary_size"})
    sequence_length: int = dataclasses.field(
        default=DEFAULT_SEQUENCE_LENGTH, metadata={"model": "max_sequence_length", "run": True}
    )
    hidden_dim: int = dataclasses.field(default=None, metadata={"model": "hidden_dim"})
    num_layers: int = dataclasses.field(default=None, metadata={"model": "num_layers"})
    num_heads: int = dataclasses.field(default=None, metadata={"model": "num_heads"})
    head_dim: int = dataclasses.field(default=None, metadata={"model": "head_dim"})
    dropout: float = dataclasses.field(default=None, metadata={"model": "dropout"})
    position_mode: str = dataclasses.field(default=None, metadata={"model": "position_mode"})
    batch_size: int = dataclasses.field(default=128, metadata={"run": True})
    epochs: int = 1
    max_steps: int = None
    optimizer: str = dataclasses.field(default="adam", metadata={"run": True})
    dtype_policy: str = dataclasses.field(default="float32", metadata={"run": True})
    init_from: str = None
    lora_rank: int = None
    merge_lora: bool = False
    carry_state: bool = dataclasses.field(default=False, metadata={"run": True})
    pack_documents: bool = dataclasses.field(default=False, metadata={"run": True})
    seed: int = dataclasses.field(default=0, metadata={"run": True})
    checkpoint_every: int = 20
    keep_checkpoints: int = 2
    force_new: bool = False
    eval_batches: int = None
    strategy: str = "default"
    verbose: int = dataclasses.field(default=1, metadata={"local": True})

    def __post_init__(self):
        def fail(name, expected):
            value = getattr(self, name)
            raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")

        if self.architecture not in ARCHITECTURES:
            fail("architecture", f"one of {sorted(ARCHITECTURES)}")
        if not isinstance(self.corpus, CorpusSettings):
            fail("corpus", "a CorpusSettings")
        if self.corpus.tfds_dir is not None and data_kind(self.corpus.data) in ("text", "jsonl"):
            # tensorflow-datasets prepares WikiText and tfds: data there; text files are read where they are.
            raise ValueError(
                f"--tfds-dir is where tensorflow-datasets keeps prepared data, and data={self.corpus.data!r} is "
                f"read from its files: leave --tfds-dir out. Received: tfds_dir={self.corpus.tfds_dir!r}"
            )
        if self.size not in MODEL_SIZES:
            fail("size", f"one of {list(MODEL_SIZES)}")
        if self.strategy not in STRATEGIES:
            fail("strategy", f"one of {list(STRATEGIES)}")
        if self.optimizer not in OPTIMIZERS:
            fail("optimizer", f"one of {list(OPTIMIZERS)}")
        if self.position_mode is not None and self.position_mode not in POSITION_MODES:
            fail("position_mode", f"one of {list(POSITION_MODES)}")
        if self.position_mode is not None and "elita" not in ARCHITECTURES[self.architecture]["blocks"]:
            raise ValueError(
                f"`position_mode` sets the positions of ELiTA blocks, and architecture {self.architecture!r} has "
                f"none. Received: position_mode={self.position_mode!r}"
            )
        if self.dtype_policy not in DTYPE_POLICIES:
            fail("dtype_policy", f"one of {list(DTYPE_POLICIES)}")
        for name, (least, most) in INTEGER_RANGES.items():
            if getattr(self, name) is not None or name not in _OPTIONAL:
                check_integer(name, getattr(self, name), least, most)
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            fail("dropout", "in [0, 1)")
        if self.lora_rank is not None and self.init_from is None:
            fail("lora_rank", "None without init_from: LoRA adapts a trained model")
        if self.tokenizer_from is not None and self.init_from is not None:
            fail("tokenizer_from", "None with init_from: fine-tuning keeps the model's own tokenizer")
        if self.merge_lora and self.lora_rank is None:
            fail("merge_lora", "False without lora_rank: there are no adapters to merge")
        if self.pack_documents and (self.position_mode or ARCHITECTURES[self.architecture].get("position_mode")) == (
            "length"
        ):
            raise ValueError(
                "`pack_documents` restarts positions at each document, and position_mode='length' moves them with "
                f"the window's length. Received: architecture={self.architecture!r}, position_mode='length'"
            )
        if self.pack_documents and self.carry_state:
            fail("pack_documents", "False with carry_state: carried streams restart at every document already")
        if self.carry_state and self.strategy != "default":
            raise ValueError(
                "A carried state is one batch of streams in one process: `carry_state` needs strategy='default'. "
                f"Received: strategy={self.strategy!r}"
            )


def model_fields():
    """`{TrainSettings field: ElitaBackbone argument}` of the fields that shape the model."""
    return {
        field.name: field.metadata["model"] for field in dataclasses.fields(TrainSettings) if "model" in field.metadata
    }


def fields_marked(mark):
    """The names of `TrainSettings`' fields marked `mark` (`"run"`: what makes a run that run; `"local"`:
    what may differ between the machines of one run)."""
    return [field.name for field in dataclasses.fields(TrainSettings) if field.metadata.get(mark)]


def train_settings(**fields):
    """`TrainSettings` from flat fields: its own and its corpus's (`CorpusSettings`), as the command lines give them.

    Example:
    >>> train_settings(output_dir="runs/mine", data="notes.jsonl", text_field="body").corpus.text_field
    'body'
    """
    corpus_fields = {field.name for field in dataclasses.fields(CorpusSettings)}
    corpus = {key: value for key, value in fields.items() if key in corpus_fields}
    own = {key: value for key, value in fields.items() if key not in corpus_fields}
    return TrainSettings(**own, corpus=CorpusSettings(**corpus))
