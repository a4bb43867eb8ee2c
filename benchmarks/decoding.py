"""Milliseconds per generated token against context length, through `ElitaCausalLM.generate` and `Generator`.

For each (preset, context L) one model is built and an L-token prompt generates greedily through
both paths in the same run: keras-hub's `ElitaCausalLM.generate` (token ids in, no preprocessor)
and the lower-level `elita_tf.generation.Generator`. The time per token is
`(t(2 * steps) - t(steps)) / steps`: the prefill and the fixed costs cancel (`generate` also
prefills the `steps` extra padded positions of its longer buffer, a parallel pass of a few
microseconds a position). Presets that decode from constant-size states only (ELiTA) keep their
training length; presets with key/value buffers, 3Lin's wide layers or learned positions get
`context_length = L + 2 * steps` so that the buffers hold the generation.

With `--saved-model`, the same model is also exported as the serving SavedModel
(`elita_tf.export.export_saved_model`, with a SentencePiece model trained on random words) and
its `generate` signature is timed on a prompt of L one-piece words, text in and text out.

With `--litert`, the same model is also exported as LiteRT files (float32 and int8 weights,
`elita_tf.litert.export_litert`) and run by the `ai_edge_litert` interpreter: the context is
prefilled (not timed), then each of `steps` decode calls is timed, the state fed back in.

    python benchmarks/decoding.py --presets elita transformer --contexts 256 1024 4096 16384 --saved-model --litert
"""

import argparse
import os
import platform
import statistics
import tempfile
import time


def time_litert(path, prompt, steps, repeats):
    """Median ms per decode call of a LiteRT file after prefilling `prompt [1, L]` (not timed)."""
    import numpy as np

    from elita_tf.litert import litert_signatures

    prefill, decode = litert_signatures(path)
    prefilled = prefill(token_ids=np.asarray(prompt, np.int32))  # once: decode leaves its inputs as they are
    first = np.array([[int(prefilled.pop("logits")[0].argmax())]], np.int32)
    runs = []
    for _ in range(repeats):
        state, token = dict(prefilled), first
        start = time.perf_counter()
        for _ in range(steps):
            state = decode(token_ids=token, **state)
            token = np.array([[int(state.pop("logits")[0].argmax())]], np.int32)
        runs.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(runs)


def random_word_tokenizer(vocab_size, seed=0):
    """`(proto, word)`: a SentencePiece model of `vocab_size` pieces trained on random words, and a word it keeps whole."""
    import random

    import sentencepiece

    from elita_tf.data import train_sentencepiece

    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))) for _ in range(4 * vocab_size)]
    lines = (" ".join(rng.choice(words) for _ in range(12)) for _ in range(20 * vocab_size))
    proto = train_sentencepiece(lines, vocab_size=vocab_size, seed=seed)
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    whole = [w for w in words if len(processor.encode(w)) == 1]
    return proto, whole[0]


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
    parser.add_argument("--saved-model", action="store_true", help="also time the SavedModel's generate")
    parser.add_argument("--litert", action="store_true", help="also time LiteRT float and int8 files")
    args = parser.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    from elita_tf.generation import Generator
    from elita_tf.litert import export_litert
    from elita_tf.models import ElitaBackbone, ElitaCausalLM, build_decoder, preset

    workdir = tempfile.mkdtemp(prefix="elita-decoding-")

    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, tensorflow {tf.__version__}, keras {keras.__version__}")
    print(f"# B={args.batch_size} vocab={args.vocab_size} d={args.width} L={args.layers}, greedy, {args.steps} steps")
    if args.saved_model:
        import tensorflow_text  # noqa: F401  (registers the SavedModel's tokenizer ops)

        from elita_tf.export import export_saved_model

        proto, word = random_word_tokenizer(args.vocab_size)
    columns = ["ElitaCausalLM.generate", "Generator"]
    columns += ["SavedModel generate"] if args.saved_model else []
    columns += ["LiteRT float", "LiteRT int8"] if args.litert else []
    print("| preset | context | context_length | " + " | ".join(f"{c} ms / token" for c in columns) + " | ratio |")
    print("|---" * (len(columns) + 4) + "|")
    per_token = {}
    exported = {}  # (preset, context_length, quantize) -> file: constant-state presets export once
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

            def through_saved_model(steps):
                text = tf.constant([" ".join([word] * context)] * args.batch_size)  # `context` tokens
                return lambda: saved_generate(prompts=text, max_new_tokens=tf.constant(steps))["token_ids"].numpy()

            paths = [("causal_lm", through_causal_lm), ("generator", through_generator)]
            if args.saved_model:
                directory = os.path.join(workdir, f"saved-{name}-{context}")
                export_saved_model(model, config, proto, directory)
                saved_generate = tf.saved_model.load(directory).signatures["generate"]
                paths.append(("saved_model", through_saved_model))

            def timed(make, steps):
                run = make(steps)
                run()  # traces and compiles for this shape
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - start)
                return statistics.median(times)

            for path, make in paths:
                short, long = timed(make, args.steps), timed(make, 2 * args.steps)
                per_token[name, context, path] = (long - short) / args.steps * 1e3
            cells = [per_token[name, context, path] for path, _ in paths]
            if args.litert:
                for quantize in [None, "int8"]:
                    key = (name, config.context_length, quantize)
                    if key not in exported:
                        exported[key] = export_litert(
                            model, config, os.path.join(workdir, f"{len(exported)}.tflite"), quantize=quantize
                        )
                    cells.append(time_litert(exported[key], prompt[:1], args.steps, args.repeats))
            ratio = cells[0] / cells[1]
            row = " | ".join(f"{cell:.2f}" for cell in cells)
            print(f"| {name} | {context} | {config.context_length} | {row} | {ratio:.2f} |", flush=True)
    for name in args.presets:
        rows = [per_token[name, c, "causal_lm"] for c in args.contexts]
        print(f"{name}: ElitaCausalLM.generate ms/token at the longest context / shortest = {rows[-1] / rows[0]:.2f}")


if __name__ == "__main__":
    main()
