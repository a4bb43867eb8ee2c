"""`EvaluateSettings`: what one evaluation of a finished run takes, each field with its default, help and check."""

import dataclasses

from elita_tf.checks import check_integer, check_path, check_sequence_length, fail
from elita_tf.data.corpus_settings import CorpusSettings
from elita_tf.data.text_files import SPLITS
from elita_tf.export.settings import QUANTIZATIONS
from elita_tf.settings_fields import check_fields, setting, setting_like, with_attributes
from elita_tf.training.settings import TrainSettings

_RUNS = "the run's"


@with_attributes
@dataclasses.dataclass(frozen=True)
class EvaluateSettings:
    """One evaluation of a finished `elita-train` run (`elita_tf.training.evaluate`).

    By default the run's own split is cut into its own training examples, so
    the float result equals the run's `results.json` figure. Each field's help
    is in its metadata: `elita-evaluate --help` and this docstring's
    `Attributes:` are written from it, and the fields shared with
    `TrainSettings` and `CorpusSettings` take theirs (`setting_like`).

    Example:
    >>> EvaluateSettings("runs/elita", sequence_length=4096, carry_state=True).split
    'test'
    >>> EvaluateSettings("runs/elita", litert="elita.tflite", quantize="int8")
    Traceback (most recent call last):
    ValueError: A LiteRT file carries its own quantization: pass `litert` or `quantize`. Received: quantize='int8'
    """

    run_dir: str = setting(
        help="A finished elita-train run directory (its `run.json` says how it was cut).", check=check_path
    )
    split: str = setting("test", "Which split of the data to score.", choices=SPLITS)
    corpus: CorpusSettings = setting(
        None, "Other text to score instead of the run's own (`CorpusSettings`; its fields are flags of their "
        "own). Text files and JSON Lines are scored whole, every token after the first exactly once (the "
        "result's split is \"all\"); WikiText and TFDS data by `split`.", default_help=_RUNS + " own data",
    )
    data_dir: str = setting_like(CorpusSettings, "data_dir")
    tfds_dir: str = setting_like(CorpusSettings, "tfds_dir")
    batch_size: int = setting(
        None, "Sequences a batch.", check=check_integer,
        default_help="the run's batch size, scaled to keep its tokens a batch with another `sequence_length`",
    )
    eval_batches: int = setting(
        None, "A cap on batches of sequences, or on segments with `carry_state`.", check=check_integer,
        default_help="every one",
    )
    quantize: str = setting(None, "Evaluate the model after Keras' `quantize(MODE)`.", choices=QUANTIZATIONS)
    litert: str = setting(
        None, "Score the run's sequences through this LiteRT file of the run (elita-export --format litert), one "
        "token at a time, in ai-edge-litert's interpreter.",
    )
    sequence_length: int = setting(
        None, "`N`: the split is cut into sequences of N tokens (a segment of N with `carry_state`). Models "
        "with learned positions take at most their max_sequence_length; ELiTA's sinusoidal positions continue "
        "past it.",
        check=check_sequence_length, default_help="the run's `sequence_length`",
    )
    carry_state: bool = setting(
        False, "Read the split as one stream, `N` tokens at a time, each segment continuing from the decoding "
        "state of the one before (a model that carries its state: `ElitaBackbone.carries_state`).",
    )
    position_mode: str = setting_like(
        TrainSettings, "position_mode", default_help=_RUNS + "; the modes agree up to the training length"
    )
    pack_documents: bool = setting_like(TrainSettings, "pack_documents", default_help="as the run trained")
    verbose: int = setting(1, "1 for a progress bar, 0 for none.", choices=(0, 1), local=True)

    def __post_init__(self):
        check_fields(self)
        if self.corpus is not None and not isinstance(self.corpus, CorpusSettings):
            fail("corpus", self.corpus, "None or a CorpusSettings")
        if self.litert is not None and self.quantize is not None:
            raise ValueError(
                "A LiteRT file carries its own quantization: pass `litert` or `quantize`. "
                f"Received: quantize={self.quantize!r}"
            )
        if self.litert is not None and (self.sequence_length is not None or self.carry_state):
            raise ValueError(
                "A LiteRT file is scored in the run's own sequences: leave `sequence_length` and `carry_state` "
                "unset. "
                f"Received: sequence_length={self.sequence_length!r}, carry_state={self.carry_state!r}"
            )
        if self.pack_documents and (self.litert is not None or self.carry_state):
            raise ValueError(
                "Packed documents are scored in sequences by the model itself: leave `litert` and `carry_state` "
                f"unset. Received: pack_documents=True, litert={self.litert!r}, carry_state={self.carry_state!r}"
            )
