"""`TrainSettings`: everything one training run takes, each field with its default, help and check."""

import dataclasses
import functools

from elita_tf.checks import INT64_MAX, SEED_MAX, check_choice, check_dropout, check_integer, check_path, fail
from elita_tf.checks import check_byte_fallback_vocabulary, check_sequence_length, check_vocabulary_size
from elita_tf.data.corpus_settings import CorpusSettings
from elita_tf.data.text_files import data_kind
from elita_tf.layers.options import POSITION_MODES
from elita_tf.models.architectures import ARCHITECTURES, DEFAULT_SEQUENCE_LENGTH, MODEL_SIZES
from elita_tf.settings_fields import check_fields, setting, with_attributes

STRATEGIES = ("default", "mirrored", "multiworker", "data-parallel")
# Each Keras backend's strategies, and what to use instead of the others: tf.distribute's on TensorFlow,
# keras.distribution's on JAX (`elita_tf.training.distributed`), none on PyTorch.
BACKEND_STRATEGIES = {
    "tensorflow": (
        ("default", "mirrored", "multiworker"),
        "'data-parallel' is keras.distribution's, on JAX (KERAS_BACKEND=jax); TensorFlow's is 'mirrored' on one "
        "machine, 'multiworker' across machines",
    ),
    "jax": (
        ("default", "data-parallel"),
        "'mirrored' and 'multiworker' are TensorFlow's (tf.distribute); JAX's is 'data-parallel', on one machine "
        "or across processes",
    ),
    "torch": (("default",), "Keras has no distribution on PyTorch: train on JAX or TensorFlow to use several devices"),
}
OPTIMIZERS = ("adam", "normalized-sgd")
DTYPE_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")

# Step and batch counts are int64; the verbosity is Keras' 0, 1 or 2.
_count = functools.partial(check_integer, most=INT64_MAX)
_seed = functools.partial(check_integer, least=0, most=SEED_MAX)
_verbosity = functools.partial(check_integer, least=0, most=2)
_SIZE = "the `size`'s"
# The architectures are checked, not given to argparse as choices: its usage line would list them all.
_ARCHITECTURE_NAMES = sorted(ARCHITECTURES)
_architecture = functools.partial(check_choice, choices=_ARCHITECTURE_NAMES)


@with_attributes
@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """One training run of an architecture on a corpus, WikiText-2 by default (`elita_tf.training.train`).

    The model's fields carry `ElitaBackbone`'s names (`model_fields`);
    `sequence_length` is the training example's length `T`, which is also the
    model's `max_sequence_length`. A model field left None takes `size`'s
    value, or `ElitaBackbone`'s default; a fine-tuned run takes the model it
    starts from (`elita_tf.training.model_settings.complete_settings`).
    Each field's help is in its metadata (`setting`): `elita-train --help`
    and this docstring's `Attributes:` are written from it (`with_attributes`).

    Example:
    >>> settings = TrainSettings("runs/elita", architecture="elita", epochs=2)  # doctest: +SKIP
    >>> mine = TrainSettings("runs/mine", corpus=CorpusSettings("my-texts/*.txt"), size="25m")  # doctest: +SKIP
    >>> results = elita_tf.training.train(settings)                       # doctest: +SKIP
    """

    output_dir: str = setting(
        help="The run directory: its checkpoints, logs, results and final preset (`RunDirectory`). A run "
        "already there resumes.",
        check=check_path,
        local=True,
    )
    architecture: str = setting(
        "elita",
        f"The architecture: one of {_ARCHITECTURE_NAMES} (`elita_tf.models.ARCHITECTURES`).",
        check=_architecture,
    )
    corpus: CorpusSettings = setting(
        CorpusSettings, "The text and how it is split (`CorpusSettings`; its fields are flags of their own).",
        default_help="WikiText-2",
    )
    tokenizer_sample_bytes: int = setting(
        10**9, "SentencePiece trains on a seeded sample of at most this much train text (all of WikiText-2 and "
        "-103 fit the default).", check=_count,
    )
    tokenizer_from: str = setting(
        None, "Reuse the SentencePiece model of a finished run directory or keras-hub preset instead of training "
        "one; the vocabulary size is the tokenizer's (`tokenizer_from_settings`).",
    )
    size: str = setting(
        "seed", "The model's width, depth and heads: a key of `elita_tf.models.MODEL_SIZES` (\"seed\", about 1M "
        "parameters; \"25m\"; \"100m\"). `hidden_dim`, `num_layers`, `num_heads` and `head_dim` override it.",
        choices=tuple(MODEL_SIZES),
    )
    vocabulary_size: int = setting(
        5000, "SentencePiece pieces: the tokenizer's vocabulary, and the model's (`ElitaBackbone`'s "
        "vocabulary_size).", check=check_vocabulary_size, model="vocabulary_size",
    )
    sequence_length: int = setting(
        DEFAULT_SEQUENCE_LENGTH, "Tokens in a training example (`T`, at least 2); also the model's "
        "max_sequence_length, the positions its finite buffers hold (`ElitaBackbone`).",
        check=check_sequence_length, model="max_sequence_length", run=True,
    )
    hidden_dim: int = setting(None, "Model width `d`.", check=check_integer, default_help=_SIZE, model="hidden_dim")
    num_layers: int = setting(None, "Blocks.", check=check_integer, default_help=_SIZE, model="num_layers")
    num_heads: int = setting(
        None, "Heads per attention layer.", check=check_integer, default_help=_SIZE, model="num_heads"
    )
    head_dim: int = setting(None, "Width per head.", check=check_integer, default_help=_SIZE, model="head_dim")
    dropout: float = setting(
        None, "Dropout rate in [0, 1), in training only: on the embeddings, on each block's mixer and "
        "feed-forward outputs before they join the residual stream, on the Transformer's attention weights "
        "and on the additive blocks' pooled vectors (`ElitaBackbone`'s dropout).",
        check=check_dropout, default_help="the backbone's, 0", model="dropout",
    )
    position_mode: str = setting(
        None, "ELiTA's positions: \"fixed\" (the sinusoids run on past the training length), \"clamped\" (every "
        "later position reads as the last one trained) or \"length\" (the original's, moving with the sequence "
        "length; no decoding).", choices=POSITION_MODES,
        default_help="a resumed run's own, else the architecture's (elita-reference: \"length\"); a new elita "
        "run gets \"clamped\", or \"fixed\" with `carry_state`, whose positions run on through each article "
        "and are trained there (`resolve_position_mode`)",
        model="position_mode",
    )
    batch_size: int = setting(128, "Training examples a step, over all devices.", check=check_integer, run=True)
    epochs: int = setting(1, "Passes over the train split (`max_steps` may end the run sooner).", check=_count)
    max_steps: int = setting(None, "A cap on steps in all (a token budget).", check=_count, default_help="no cap")
    optimizer: str = setting(
        "adam", "\"adam\" (ELiTA's: `min(1e-3, 1e-2 / sqrt(step))`, beta1 0.9, beta2 0.99) or "
        "\"normalized-sgd\" (3Lin's: every matrix moves by 0.1 in norm per step, linearly to 0 over the last "
        "tenth of the run).", choices=OPTIMIZERS, run=True,
    )
    dtype_policy: str = setting(
        "float32", "\"float32\", or Keras' \"mixed_bfloat16\" or \"mixed_float16\": float32 weights, the "
        "layers computing in 16 bits (the recurrent states, the loss and the head stay float32).",
        choices=DTYPE_POLICIES, run=True,
    )
    init_from: str = setting(
        None, "Fine-tuning: start from the weights, tokenizer and architecture of a trained model (a finished "
        "run directory or a keras-hub preset). Its architecture wins: a model field given that disagrees with "
        "it is an error (`init_from_settings`).",
    )
    lora_rank: int = setting(
        None, "With `init_from`, train LoRA adapters of this rank on every projection and nothing else (Hu et "
        "al. 2021).", check=check_integer,
    )
    merge_lora: bool = setting(
        False, "With `lora_rank`, the run's preset holds the merged weights `W + A B` (a plain model) instead "
        "of the adapters.",
    )
    carry_state: bool = setting(
        False, "Truncated backpropagation through time: each batch row reads its own contiguous stream of the "
        "split, and every block's decoding state carries over from one step to the next, restarting at each "
        "article (gradients stop at segment boundaries; the state is checkpointed). Needs a model that "
        "carries its state (`ElitaBackbone.carries_state`: elita) and the default strategy.",
        run=True,
    )
    pack_documents: bool = setting(
        False, "Training examples hold documents back to back, and no position sees another document in any "
        "block: states and buffers restart, softmax masks are block-diagonal, learned positions restart. The "
        "loss (training and evaluation) leaves out each document's first token, which has nothing before it "
        "to be predicted from.",
        run=True,
    )
    seed: int = setting(0, "Seeds the data order, the tokenizer's sample and the weights.", check=_seed, run=True)
    checkpoint_every: int = setting(20, "Steps between checkpoints.", check=_count)
    keep_checkpoints: int = setting(2, "How many of the newest checkpoints to keep.", check=_count)
    force_new: bool = setting(False, "Discard a run already in `output_dir` instead of resuming it.")
    eval_batches: int = setting(
        None, "A cap on validation and test batches.", check=_count, default_help="every batch"
    )
    strategy: str = setting(
        "default", "\"default\" (one device). On TensorFlow, \"mirrored\" (every GPU of this machine) or "
        "\"multiworker\" (machines listed in TF_CONFIG); on JAX, \"data-parallel\" (every device, of every process "
        "that KERAS_DISTRIBUTION_* variables join): each device takes its rows of every global batch.",
        choices=STRATEGIES,
    )
    verbose: int = setting(
        1, "Keras `fit` verbosity (0 silent, 1 a progress bar, 2 a line an epoch).", check=_verbosity, local=True
    )
    # Last: a field added since 0.1.0 moves no other field's position.
    byte_fallback: bool = setting(
        False, "SentencePiece spells a character it has no piece for in UTF-8 byte pieces (as Llama's and "
        "Gemma's tokenizers), so that no text, a prompt's new characters included, becomes `<unk>`; needs a "
        "vocabulary of 261 pieces or more. Without it, byte pieces are there only where the vocabulary cannot "
        "hold every character of the train text.", run=True,
    )
    model_parallel: int = setting(
        None, "On JAX, cut every block's heads (or hidden features) and the vocabulary over this many devices "
        "(`ElitaBackbone.get_layout_map`); the others split the batch: a mesh of (devices / K, K).",
        check=_count, default_help="none",
    )

    def __post_init__(self):
        check_fields(self)
        if not isinstance(self.corpus, CorpusSettings):
            fail("corpus", self.corpus, "a CorpusSettings")
        if self.corpus.tfds_dir is not None and data_kind(self.corpus.data) in ("text", "jsonl"):
            # tensorflow-datasets prepares WikiText and tfds: data there; text files are read where they are.
            raise ValueError(
                f"--tfds-dir is where tensorflow-datasets keeps prepared data, and data={self.corpus.data!r} is "
                f"read from its files: leave --tfds-dir out. Received: tfds_dir={self.corpus.tfds_dir!r}"
            )
        if self.position_mode is not None and "elita" not in ARCHITECTURES[self.architecture]["blocks"]:
            raise ValueError(
                f"`position_mode` sets the positions of ELiTA blocks, and architecture {self.architecture!r} has "
                f"none. Received: position_mode={self.position_mode!r}"
            )
        if self.byte_fallback:
            check_byte_fallback_vocabulary("vocabulary_size", self.vocabulary_size)
        if self.lora_rank is not None and self.init_from is None:
            fail("lora_rank", self.lora_rank, "None without init_from: LoRA adapts a trained model")
        if self.tokenizer_from is not None and self.init_from is not None:
            expected = "None with init_from: fine-tuning keeps the model's own tokenizer"
            fail("tokenizer_from", self.tokenizer_from, expected)
        if self.merge_lora and self.lora_rank is None:
            fail("merge_lora", self.merge_lora, "False without lora_rank: there are no adapters to merge")
        if self.pack_documents and (self.position_mode or ARCHITECTURES[self.architecture].get("position_mode")) == (
            "length"
        ):
            raise ValueError(
                "`pack_documents` restarts positions at each document, and position_mode='length' moves them with "
                f"the sequence's length. Received: architecture={self.architecture!r}, position_mode='length'"
            )
        if self.pack_documents and self.carry_state:
            fail("pack_documents", True, "False with carry_state: carried streams restart at every document already")
        if self.carry_state and (self.strategy != "default" or self.model_parallel is not None):
            raise ValueError(
                "A carried state is one batch of streams on one device: `carry_state` needs strategy='default' "
                f"and no model_parallel. Received: strategy={self.strategy!r}, model_parallel={self.model_parallel}"
            )
        self._check_backend()

    def _check_backend(self):
        """The strategy and model parallelism are the backend's (`BACKEND_STRATEGIES`)."""
        import keras  # here, not at the top: `elita-train --help` answers without Keras

        backend = keras.config.backend()
        strategies, instead = BACKEND_STRATEGIES.get(backend, (("default",), f"Keras runs on {backend}"))
        if self.strategy not in strategies:
            raise ValueError(
                f"On {backend}, `strategy` must be one of {list(strategies)}: {instead}. Received: "
                f"strategy={self.strategy!r}"
            )
        if self.model_parallel is not None and backend != "jax":
            expected = f"None on {backend}: model parallelism is keras.distribution's, on JAX"
            fail("model_parallel", self.model_parallel, expected)


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
