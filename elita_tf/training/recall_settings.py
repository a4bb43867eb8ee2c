"""`RecallSettings`: the MQAR grid of `elita-recall` and the training of each cell, each field with its help and check.

No TensorFlow: `elita-recall --help` and a bad flag answer from here at once.
"""

import argparse
import dataclasses
import functools

from elita_tf.checks import SEED_MAX, check_integer, check_non_negative_number, check_positive_number, fail
from elita_tf.renames import accepts_renamed_arguments
from elita_tf.settings_fields import check_fields, setting, with_attributes

# The seven designs of the comparison (the `*-reference` architectures are the same blocks wrapped otherwise).
DESIGNS = ("elita", "transformer", "simplified", "simplified-wide", "linear", "3lin", "additive")
# Zoology's early stop: training ends once test accuracy passes it.
SOLVED = 0.99
# Zoology's sweep, `numpy.logspace(-4, -2, 4)`: 1e-4, 4.6e-4, 2.2e-3 and 1e-2.
ZOOLOGY_LEARNING_RATES = tuple(10.0 ** (-4 + 2 * i / 3) for i in range(4))
# The cpu protocol's sweep: Zoology's two middle rates and 1e-3 between them, the one rate at which the Transformer
# passes T = 64 with 4 pairs and T = 128 with 8 on this protocol's budget (docs/results.md).
CPU_LEARNING_RATES = (ZOOLOGY_LEARNING_RATES[1], 1e-3, ZOOLOGY_LEARNING_RATES[2])
PROTOCOLS = ("cpu", "zoology")


def zoology_batch_size(sequence_length):
    """Zoology's batch size at a sequence length: 512 up to 128, 256 at 256, 128 at 512, 64 beyond."""
    for longest, batch_size in ((128, 512), (256, 256), (512, 128)):
        if sequence_length <= longest:
            return batch_size
    return 64


def parse_task(text):
    """`"64:4"` -> `(64, 4)`: a sequence length and its number of pairs, as `--tasks` takes them.

    Example:
    >>> parse_task("64:4")
    (64, 4)
    """
    try:
        sequence_length, num_pairs = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a task is SEQUENCE_LENGTH:NUM_PAIRS, as 64:4. Received: {text!r}") from None
    return sequence_length, num_pairs


def _each(check):
    """A check of every item of a tuple, naming the tuple, and of the tuple: non-empty."""

    def check_items(name, values):
        if not isinstance(values, tuple) or not values:
            fail(name, values, "a non-empty tuple")
        for value in values:
            check(name, value)

    return check_items


def _task(name, task):
    """A `(sequence_length, num_pairs)` pair; MQAR's rules on it (`check_mqar`) run with the vocabulary's."""
    if not (isinstance(task, tuple) and len(task) == 2):
        fail(name, task, "(sequence_length, num_pairs) pairs")


# The fields that say what a cell is across its grid: a cell's own width, task and learning rate are its keys.
GRID_FIELDS = ("widths", "tasks", "learning_rates")


@with_attributes
@dataclasses.dataclass(frozen=True)
class RecallSettings:
    """The grid of `elita-recall` (`elita_tf.training.recall`) and the training of every cell.

    Each field's help is in its metadata: `elita-recall --help` and this
    docstring's `Attributes:` are written from it. Lists become tuples.

    Example:
    >>> RecallSettings(widths=[64], tasks=[(64, 4)]).widths
    (64,)
    >>> RecallSettings(num_heads=0)
    Traceback (most recent call last):
    ValueError: `num_heads` must be a positive integer. Received: num_heads=0
    """

    protocol: str = setting(
        "cpu", "The model and data rules. `cpu`: each architecture as it is, new training sequences every epoch. "
        "`zoology`: Zoology's figure 2, a model of no feed-forward network (the state mixer is the identity), "
        "tied embeddings, dropout 0.1 and learned positions only where an architecture has softmax attention, on "
        "one fixed set of training sequences; on the command line it also sets the other flags' defaults to "
        "Zoology's (`elita_tf.training.recall`).",
        choices=PROTOCOLS,
    )
    widths: tuple = setting(
        (64,), "The hidden widths `d`, each of `num_heads` heads of d / num_heads.",
        check=_each(check_integer), nargs="+", parse=int, default_help="64",
    )
    tasks: tuple = setting(
        ((64, 4), (128, 8)), "MQAR tasks, each SEQUENCE_LENGTH:NUM_PAIRS: the sequence length (even) and the "
        "key-value pairs (at most a quarter of it).",
        check=_each(_task), nargs="+", parse=parse_task, default_help="64:4 128:8",
    )
    learning_rates: tuple = setting(
        CPU_LEARNING_RATES, "The sweep: each cell's figure is the best of these learning rates (Zoology's two "
        "middle ones and 1e-3, where the Transformer passes on the cpu protocol's budget; Zoology sweeps 1e-4 "
        "4.6e-4 2.2e-3 1e-2).",
        check=_each(check_positive_number), nargs="+", parse=float, default_help="4.6e-4 1e-3 2.2e-3",
    )
    vocabulary_size: int = setting(
        512, "MQAR's `V`: keys from [1, V/2), values from [V/2, V).", check=check_integer
    )
    train_examples: int = setting(
        8192, "Training sequences an epoch: with `protocol` cpu drawn anew every epoch (a fixed set this small is "
        "memorised: test accuracy stays at chance while the loss falls), with zoology one fixed set.",
        check=check_integer,
    )
    test_examples: int = setting(1024, "Test sequences, one set, none of the training draws.", check=check_integer)
    epochs: int = setting(
        64, "Epochs at most: a cell stops after the first epoch whose test accuracy passes 0.99.", check=check_integer
    )
    batch_size: int = setting(
        64, "Sequences a step; None (`protocol` zoology's default) takes Zoology's by sequence length: 512 up to "
        "128, 256 at 256, 128 at 512, 64 beyond.", check=functools.partial(check_integer, optional=True),
    )
    num_layers: int = setting(2, "Blocks.", check=check_integer)
    num_heads: int = setting(1, "Heads a block (Zoology's attention: one).", check=check_integer)
    weight_decay: float = setting(0.1, "AdamW's weight decay.", check=check_non_negative_number)
    power_a: float = setting(
        0.01, "The power law of the gaps before the queries: p(g) ∝ a (g + 1)^(a - 1) (Zoology's 0.01), in (0, 1] "
        "(checked with the tasks, by `check_mqar`).",
    )
    random_non_queries: bool = setting(
        True, "Random tokens between the queries (Zoology's default), or 0s (its figure 2's)."
    )
    seed: int = setting(
        0, "Seeds the data, the weights and the shuffle.",
        check=functools.partial(check_integer, least=0, most=SEED_MAX),
    )

    def __post_init__(self):
        for name in GRID_FIELDS:  # lists, as a command line or json gives them, become tuples
            value = getattr(self, name)
            if isinstance(value, list):
                value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
                object.__setattr__(self, name, value)
        check_fields(self)
        from elita_tf.data.mqar import check_mqar

        for sequence_length, num_pairs in self.tasks:
            check_mqar(self.vocabulary_size, sequence_length, num_pairs, self.power_a)
        for width in self.widths:
            if width % self.num_heads:
                fail("widths", list(self.widths), f"divisible by num_heads = {self.num_heads}")
        largest = max(self.batch_size_at(sequence_length) for sequence_length, _ in self.tasks)
        if self.train_examples < largest:
            fail("train_examples", self.train_examples, f"at least batch_size = {largest}: a step an epoch")

    def batch_size_at(self, sequence_length):
        """The batch size of a task of this length: `batch_size`, or Zoology's where it is None."""
        return zoology_batch_size(sequence_length) if self.batch_size is None else self.batch_size

    def cell_settings(self):
        """The fields that shape every cell, beyond its own width, task and learning rate: a finished cell is
        reused only where they match."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in GRID_FIELDS}


RecallSettings.__init__ = accepts_renamed_arguments(RecallSettings.__init__)

# `--protocol zoology`'s defaults: figure 2 of Zoology (its `iclr24_zoology_figure2/configs.py`), whole.
ZOOLOGY = dict(
    protocol="zoology",
    widths=(64, 128, 256, 512),
    tasks=((64, 4), (128, 8), (256, 16)),
    learning_rates=ZOOLOGY_LEARNING_RATES,
    vocabulary_size=8192,
    train_examples=100_000,
    test_examples=3_000,
    epochs=64,
    batch_size=None,
    random_non_queries=False,
)

# `--quick`'s settings (`RecallSettings(**QUICK)`): two designs' worth of seconds, for CI.
QUICK = dict(
    widths=(16,),
    tasks=((16, 2),),
    learning_rates=(3e-3,),
    vocabulary_size=32,
    train_examples=128,
    test_examples=64,
    epochs=1,
    batch_size=32,
    num_layers=2,
    num_heads=2,
)
