"""The training step of this checkout against another checkout's, in one process, round after round.

Between processes this 2-core machine's speed moves by more than most changes to a step; in one
process, alternating, it does not. The other checkout's `elita_tf/` is copied as a package named
`elita_other` (every `elita_tf` in it renamed, so both register their Keras classes side by side):

    mkdir -p OTHER && cp -r CHECKOUT/elita_tf OTHER/elita_other
    grep -rl elita_tf OTHER/elita_other | xargs sed -i 's/elita_tf/elita_other/g'
    PYTHONPATH=OTHER:. python benchmarks/step_ab.py [--jit-compile] [--architectures elita transformer]

Both sides build the same model with the same weights, compiled as `elita-train` compiles it, and take
the same batch of `elita-train`'s seed configuration (B = 128, T = 256). Each round times one step of
every subject, the order alternating; the ratio is taken within each round, and the table gives the
median over rounds.
"""

import argparse
import json
import statistics
import time

import keras
import numpy as np


def build(package, architecture, jit_compile, vocabulary_size):
    models = __import__(f"{package}.models", fromlist=["ElitaBackbone"])
    schedules = __import__(f"{package}.schedules", fromlist=["elita_adam"])
    keras.utils.set_random_seed(0)
    causal_lm = models.ElitaCausalLM(models.ElitaBackbone.from_architecture(architecture, vocabulary_size))
    causal_lm.compile(
        schedules.elita_adam(),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=None,
        jit_compile=jit_compile,
    )
    return causal_lm


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--architectures", nargs="+", default=["elita", "transformer"])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--jit-compile", action="store_true")
    args = parser.parse_args()

    batch, length, vocabulary_size = 128, 256, 5000
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocabulary_size, size=(batch, length + 1)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((batch, length), "int32")}
    y = ids[:, 1:]
    subjects = {}
    for architecture in args.architectures:
        this = build("elita_tf", architecture, args.jit_compile, vocabulary_size)
        other = build("elita_other", architecture, args.jit_compile, vocabulary_size)
        this(x), other(x)
        other.set_weights(this.get_weights())
        subjects[architecture, "this"], subjects[architecture, "other"] = this, other
    first_losses = {key: float(model.train_on_batch(x, y)) for key, model in subjects.items()}  # traces, compiles

    times = {key: [] for key in subjects}
    keys = list(subjects)
    for round_index in range(args.rounds):
        for key in keys if round_index % 2 == 0 else keys[::-1]:
            start = time.perf_counter()
            subjects[key].train_on_batch(x, y)
            times[key].append(time.perf_counter() - start)
    for architecture in args.architectures:
        this, other = times[architecture, "this"], times[architecture, "other"]
        ratios = [a / b for a, b in zip(this, other)]
        result = {
            "architecture": architecture,
            "jit_compile": args.jit_compile,
            "this_step_s": statistics.median(this),
            "other_step_s": statistics.median(other),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "first_loss_this": first_losses[architecture, "this"],
            "first_loss_other": first_losses[architecture, "other"],
            "rounds": args.rounds,
        }
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
