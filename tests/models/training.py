"""Small causal LMs compiled as `elita-train` compiles them, and batches of a rule they learn in a few steps."""

import keras
import numpy as np

from elita_tf.models import ElitaBackbone, ElitaCausalLM
from elita_tf.schedules import elita_adam

TRAIN = {"hidden_dim": 32, "num_layers": 2, "num_heads": 2, "head_dim": 8, "max_sequence_length": 32}


def rule_batches(vocab=24, length=32, batch=8, steps=20, seed=0):
    """Sequences of `next = (5 * token + 1) mod V` from random starts: learnable in a few steps."""
    tokens = np.random.default_rng(seed).integers(0, vocab, size=(steps, batch, 1))
    columns = [tokens]
    for _ in range(length):
        columns.append((5 * columns[-1] + 1) % vocab)
    seqs = np.concatenate(columns, axis=-1).astype("int32")
    return [({"token_ids": s[:, :-1], "padding_mask": np.ones_like(s[:, :-1])}, s[:, 1:]) for s in seqs]


def trainable(name, dtype=None, optimizer=None, jit_compile=None, **compile_kwargs):
    """A causal LM compiled as `elita-train` compiles it: the loss alone, no metrics.

    `jit_compile` defaults to True on JAX, as Keras compiles there for `elita-train` (JAX's eager step runs op by op:
    12 steps of ELiTA took 68 s eagerly and 10 s compiled, with the compilation, on 2 cores), and to False elsewhere,
    so that TensorFlow and PyTorch run the step's Python as written.
    """
    if jit_compile is None:
        jit_compile = keras.backend.backend() == "jax"
    keras.utils.set_random_seed(0)
    causal_lm = ElitaCausalLM(ElitaBackbone.from_architecture(name, vocabulary_size=24, dtype=dtype, **TRAIN))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compile_kwargs.setdefault("weighted_metrics", None)
    causal_lm.compile(optimizer or elita_adam(), loss, jit_compile=jit_compile, **compile_kwargs)
    return causal_lm
