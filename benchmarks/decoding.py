"""Milliseconds per generated token against context length, through `ElitaCausalLM.generate` and `Generator`.

For each (preset, context L) one model is built and an L-token prompt generates greedily through
both paths in the same run: keras-hub's `ElitaCausalLM.generate` (token ids in, no preprocessor)
and the lower-level `elita_tf.generation.Generator`. The time per token is
`(t(2 * steps) - t(steps)) / steps`: the prefill and the fixed costs cancel (`generate` also
prefills the `steps` extra padded positions of its longer buffer, a parallel pass of a few
microseconds a position). Presets that decode from constant-size states only (ELiTA) keep their
training length; presets with key/value buffers, 3Lin's wide layers or learned positions get
`context_length = L + 2 * steps` so that the buffers hold the generation.

    python benchmarks/decoding.py --presets elita transformer --contexts 256 1024 4096 16384
"""

import argparse
import os
import platform
import statistics
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["elita", "transformer"])
    parser.add_argument("--contexts", nargs="+", type=int, default=[256, 1024, 4096, 16384])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--vocab-size", type=int, default=5000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--training-length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    from elita_tf.generation import Generator
    from elita_tf.models import ElitaBackbone, ElitaCausalLM, build_decoder, preset

    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, tensorflow {tf.__version__}, keras {keras.__version__}")
    print(f"# B={args.batch_size} vocab={args.vocab_size} d={args.width} L={args.layers}, greedy, {args.steps} steps")
    print("| preset | context | context_length | ElitaCausalLM.generate ms / token | Generator ms / token | ratio |")
    print("|---|---|---|---|---|---|")
    per_token = {}
    for context in args.contexts:
        for name in args.presets:
            config = preset(name, vocab_size=args.vocab_size, width=args.width, num_layers=args.layers)
            config = config.replace(context_length=args.training_length)
            if config.decode_limit is not None:
                config = config.replace(context_length=context + 2 * args.steps)
            model = build_decoder(config)
            generator = Generator(model, config)
            causal_lm = ElitaCausalLM(ElitaBackbone.from_decoder_config(config))
            causal_lm.set_weights(model.get_weights())
            causal_lm.compile(sampler="greedy")
            prompt = np.random.default_rng(0).integers(3, args.vocab_size, size=(args.batch_size, context))

            def through_causal_lm(steps):
                token_ids = np.zeros((args.batch_size, context + steps), "int32")
                token_ids[:, :context] = prompt
                padding_mask = np.zeros_like(token_ids)
                padding_mask[:, :context] = 1
                inputs = {"token_ids": token_ids, "padding_mask": padding_mask}
                return lambda: causal_lm.generate(inputs, stop_token_ids=None)

            def through_generator(steps):
                return lambda: generator(prompt, steps).numpy()

            def timed(make, steps):
                run = make(steps)
                run()  # traces and compiles for this shape
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - start)
                return statistics.median(times)

            for path, make in [("causal_lm", through_causal_lm), ("generator", through_generator)]:
                short, long = timed(make, args.steps), timed(make, 2 * args.steps)
                per_token[name, context, path] = (long - short) / args.steps * 1e3
            a, b = per_token[name, context, "causal_lm"], per_token[name, context, "generator"]
            print(f"| {name} | {context} | {config.context_length} | {a:.2f} | {b:.2f} | {a / b:.2f} |", flush=True)
    for name in args.presets:
        rows = [per_token[name, c, "causal_lm"] for c in args.contexts]
        print(f"{name}: ElitaCausalLM.generate ms/token at the longest context / shortest = {rows[-1] / rows[0]:.2f}")


if __name__ == "__main__":
    main()
