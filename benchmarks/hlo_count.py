"""How many operations a layer's forward and backward pass compiles to under XLA, against Keras' MultiHeadAttention.

Each operation of the optimised HLO's entry computation is at least one kernel launch on a GPU,
and a model of `L` layers launches every one of them `L` times a step: on the CPU, where XLA runs
here, their count is the proxy for the launches a GPU would make. The count is of the entry
computation of `reduce_sum(y ** 2)`'s value and its gradients with respect to the input and every
weight, by kind: fusions, dots (matrix products) and the rest. With `--steps`, also the whole
training step (`train_step`: the model, its loss and Adam's update) of ELiTA and the Transformer
at the seed size, 4 sequences of 256 tokens.

    python benchmarks/hlo_count.py                                 # B = 2, T = 2048, width 256, 4 heads of 64
    python benchmarks/hlo_count.py --sequence-length 8192 --width 512 --heads 8
    python benchmarks/hlo_count.py --steps
"""

import argparse
import collections
import json
import re

from measure import loss_functions, training_model


def counts(call, weights, inputs):
    """`{"instructions", "fusion", "dot", ...}` of the optimised HLO entry of `call`'s forward and backward."""
    import tensorflow as tf

    _, step = loss_functions(lambda x: tf.square(call(x)), weights, jit_compile=True)
    return _entry_counts(step.experimental_get_compiler_ir(inputs)(stage="optimized_hlo"))


def step_counts(architecture, batch_size=4, sequence_length=256):
    """`counts` of the whole XLA training step (`train_step`) of `architecture` at the seed size, as `elita-train`
    compiles it (the chunked loss)."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    causal_lm = training_model(architecture, vocabulary_size=5000)
    x = {
        "token_ids": tf.zeros([batch_size, sequence_length], tf.int32),
        "padding_mask": tf.ones([batch_size, sequence_length], tf.int32),
    }
    y = tf.zeros([batch_size, sequence_length], tf.int32)
    causal_lm(x)
    causal_lm.optimizer.build(causal_lm.trainable_variables)
    step = tf.function(lambda x, y: causal_lm.train_step((x, y)), jit_compile=True)
    return _entry_counts(step.experimental_get_compiler_ir(x, y)(stage="optimized_hlo"))


def _entry_counts(hlo):
    entry = hlo[hlo.index("ENTRY") :]
    entry = entry[: entry.index("\n}")]
    kinds = collections.Counter()
    for line in entry.splitlines()[1:]:
        match = re.search(r"= \S+ ([a-z-]+)\(", line)
        if match and match.group(1) not in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast"):
            kinds[match.group(1)] += 1
    return {"instructions": sum(kinds.values()), **dict(kinds)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--sequence-length", type=int, default=2048)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--steps", action="store_true", help="also count the seed size's whole training step")
    parser.add_argument("--out", help="also append the JSON lines to this file")
    args = parser.parse_args()

    import keras
    import tensorflow as tf

    from elita_tf.layers import Attention2

    x = tf.random.normal([args.batch_size, args.sequence_length, args.width])
    attention2 = Attention2(args.heads, args.head_dim, 16)
    mha = keras.layers.MultiHeadAttention(args.heads, args.head_dim)
    attention2(x[:, :8])
    mha(x[:, :8], x[:, :8], use_causal_mask=True)
    subjects = {
        "attention2": (attention2, attention2.trainable_weights),
        "mha": (lambda x: mha(x, x, use_causal_mask=True), mha.trainable_weights),
    }
    shape = {"B": args.batch_size, "T": args.sequence_length, "width": args.width, "H": args.heads, "D": args.head_dim}

    def row(name, found, **record):
        other = found["instructions"] - found.get("fusion", 0) - found.get("dot", 0)
        print(f"| {name} | {found['instructions']} | {found.get('fusion', 0)} | {found.get('dot', 0)} | {other} |")
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps({**record, **found, "tensorflow": tf.__version__}) + "\n")

    print(f"# tensorflow {tf.__version__}, keras {keras.__version__}, XLA on the CPU, {shape}")
    print("| layer, forward and backward | instructions | fusions | dots | other |")
    print("|---|---|---|---|---|")
    for name, (call, weights) in subjects.items():
        row(name, counts(call, weights, x), subject=name, **shape)
    if args.steps:
        print("\n| training step, seed size, B = 4, T = 256 | instructions | fusions | dots | other |")
        print("|---|---|---|---|---|")
        for name in ("elita", "transformer"):
            row(name, step_counts(name), subject=f"{name}-step")


if __name__ == "__main__":
    main()
