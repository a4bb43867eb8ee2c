"""The training step and `generate` of this checkout against the commit before the one-model redesign, in one process.

One-off measurement for the redesign (it knows the previous commit's API: `build_decoder`,
`DecoderModel`, `ElitaBackbone.from_decoder_config`). The previous checkout's `elita_tf/` is
copied as a package named `elita_old` (every `elita_tf` in it renamed, so both register their
Keras classes side by side):

    cp -r PREVIOUS/elita_tf OLD/elita_old && grep -rl elita_tf OLD/elita_old | xargs sed -i 's/elita_tf/elita_old/g'
    PYTHONPATH=OLD:. python benchmarks/cpu/previous_commit_ab.py

Both models have the same weights. Each round times every subject once, in turn (the order
alternating), so a slow spell of the machine falls on both; the ratio is taken within each round.
"""

import argparse
import json
import statistics
import time

import keras
import numpy as np
import tensorflow as tf


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=128, help="tokens generated per timed generate call")
    args = parser.parse_args()

    import elita_old.models as old
    from elita_old.schedules import elita_adam as old_adam

    from elita_tf.models import ElitaBackbone, ElitaCausalLM
    from elita_tf.schedules import elita_adam

    batch, length, vocabulary = 128, 256, 5000
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocabulary, size=(batch, length + 1)).astype("int32")
    x, y = ids[:, :-1], ids[:, 1:]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    keras.utils.set_random_seed(0)
    config = old.preset("elita", vocab_size=vocabulary, context_length=length, position_mode="clamped")
    previous = old.build_decoder(config)
    previous.compile(old_adam(), loss)
    current = ElitaCausalLM(
        ElitaBackbone.from_architecture(
            "elita", vocabulary_size=vocabulary, max_sequence_length=length, position_mode="clamped"
        )
    )
    current.compile(elita_adam(), loss, weighted_metrics=None)
    for layer in previous.layers:  # the same weights, layer by layer (the embedding was renamed)
        if layer.weights:
            name = "token_embedding" if layer.name == "embedding" else layer.name
            current.backbone.get_layer(name).set_weights(layer.get_weights())
    # elita-train's batches: the previous commit fed token ids, this one keras-hub's dict.
    batch_now = {"token_ids": x, "padding_mask": np.ones_like(x)}
    assert np.allclose(previous(x[:2]), current.backbone({k: v[:2] for k, v in batch_now.items()}), atol=1e-5)

    previous_lm = old.ElitaCausalLM(old.ElitaBackbone.from_decoder_config(config))
    previous_lm.backbone.set_weights(previous.get_weights())
    previous_lm.compile(sampler="greedy")
    current.compile(sampler="greedy", optimizer=elita_adam(), loss=loss, weighted_metrics=None)
    prompt = np.zeros((1, 256 + args.steps), "int32")
    prompt[0, :256] = rng.integers(3, vocabulary, size=256)
    mask = np.zeros_like(prompt)
    mask[0, :256] = 1
    prompts = {"token_ids": prompt, "padding_mask": mask}

    subjects = {
        "train_step previous": lambda: float(previous.train_on_batch(x, y)),
        "train_step current": lambda: float(current.train_on_batch(batch_now, y)),
        "generate previous": lambda: previous_lm.generate(prompts, stop_token_ids=None),
        "generate current": lambda: current.generate(prompts, stop_token_ids=None),
    }
    for run in subjects.values():  # tracing and compiling, twice: the first call of each
        run(), run()
    times = {name: [] for name in subjects}
    for round_ in range(args.rounds):
        order = list(subjects) if round_ % 2 == 0 else list(reversed(subjects))
        for name in order:
            start = time.perf_counter()
            subjects[name]()
            times[name].append(time.perf_counter() - start)
    result = {"rounds": args.rounds, "generate_tokens": args.steps, "tensorflow": tf.__version__}
    for what in ("train_step", "generate"):
        ratios = [c / p for c, p in zip(times[f"{what} current"], times[f"{what} previous"])]
        result[what] = {
            "previous_median_s": statistics.median(times[f"{what} previous"]),
            "current_median_s": statistics.median(times[f"{what} current"]),
            "current_over_previous_median": statistics.median(ratios),
            "ratios": [round(r, 4) for r in ratios],
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
