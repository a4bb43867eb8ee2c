"""The XLA training step as a GPU runs it: no data-dependent branch, and the model sizes the benchmarks use."""

import re

import keras
import pytest
import tensorflow as tf

from elita_tf.models import MODEL_SIZES, ElitaBackbone, ElitaCausalLM
from elita_tf.schedules import elita_adam


def _optimized_hlo(architecture, batch=4, length=256):
    """The optimised HLO of `fit`'s step for the seed configuration, compiled as `elita-train` compiles it.

    Four sequences of 256 tokens: 1,024 tokens, two chunks of the output head's loss, so its loop stays a loop.
    """
    keras.utils.set_random_seed(0)
    causal_lm = ElitaCausalLM(ElitaBackbone.from_architecture(architecture, vocabulary_size=5000))
    causal_lm.compile(elita_adam(), keras.losses.SparseCategoricalCrossentropy(from_logits=True), weighted_metrics=None)
    x = {"token_ids": tf.zeros([batch, length], tf.int32), "padding_mask": tf.ones([batch, length], tf.int32)}
    y = tf.zeros([batch, length], tf.int32)
    causal_lm(x)
    causal_lm.optimizer.build(causal_lm.trainable_variables)
    step = tf.function(lambda x, y: causal_lm.train_step((x, y)), jit_compile=True)
    return step.experimental_get_compiler_ir(x, y)(stage="optimized_hlo")


def _control_flow(hlo):
    """`{"conditional": [...], "while": [...]}`: the TensorFlow op each instruction came from."""
    found = {"conditional": [], "while": []}
    for line in hlo.splitlines():
        for kind in found:
            if re.search(rf"\s{kind}\(", line):
                name = re.search(r'op_name="([^"]*)"', line)
                found[kind].append(name.group(1) if name else line.strip()[:120])
    return found


def test_the_xla_training_step_has_no_conditional_and_no_more_loops_than_the_transformers():
    # XLA's GPU runtime copies a conditional's predicate to the host and breaks its command buffer there.
    # The kernel's exact-or-exponential choice, the non-finite guard and the head's loss are selects. The
    # loops left are the output head's over chunks of tokens, which both models share, and, on TensorFlow
    # 2.19's CPU compiler, the scatters of the embedding's and the head's gradients (`UnsortedSegmentSum`),
    # which it expands into loops; none is in a block.
    elita, transformer = (_control_flow(_optimized_hlo(name)) for name in ("elita", "transformer"))
    assert elita["conditional"] == [] and transformer["conditional"] == [], (elita, transformer)
    assert len(elita["while"]) <= len(transformer["while"]), (elita, transformer)
    assert "chunked_cross_entropy/while" in elita["while"], elita["while"]
    for name in elita["while"]:
        assert name == "chunked_cross_entropy/while" or name.endswith(("UnsortedSegmentSum", "UnsortedSegmentSum_1")), (
            elita["while"]
        )


@pytest.mark.parametrize(
    "size, elita_millions, transformer_millions",
    [("seed", (0.8, 1.1), (0.8, 1.2)), ("25m", (24, 32), (24, 35)), ("100m", (80, 110), (85, 115))],
)
def test_the_model_sizes_have_the_parameters_their_names_say(size, elita_millions, transformer_millions):
    # At the 5,000-token vocabulary of the WikiText runs; the Transformer's learned positions for 2,048 tokens.
    for name, (low, high) in (("elita", elita_millions), ("transformer", transformer_millions)):
        backbone = ElitaBackbone.from_architecture(
            name, vocabulary_size=5000, max_sequence_length=2048, **MODEL_SIZES[size]
        )
        assert low <= backbone.count_params() / 1e6 <= high, (name, size, backbone.count_params())


def test_the_seed_size_is_the_backbones_defaults():
    backbone = ElitaBackbone.from_architecture("elita", vocabulary_size=100)
    assert {key: getattr(backbone, key) for key in MODEL_SIZES["seed"]} == MODEL_SIZES["seed"]
