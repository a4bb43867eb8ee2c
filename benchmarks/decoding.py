"""Milliseconds per generated token against context length, through `ElitaCausalLM.generate` and its exports.

For each (architecture, context L) one model is built and an L-token prompt generates greedily
through keras-hub's `ElitaCausalLM.generate` (token ids in, no preprocessor). The time per token is the least-squares
slope of the wall time against the number of new tokens, `steps`, 2, 3 and 4 times `steps`, the
counts interleaved in each of `repeats` rounds (a slow spell of the machine falls on all of them):
the prefill and the fixed costs fall into the intercept (`generate` also prefills the padded
positions of its longer buffer, a parallel pass, which the slope counts as part of each new
token's cost, as a user pays it). The `±` is the slope's standard error. Architectures that decode
from constant-size states only (ELiTA) keep their training length; those with key/value buffers,
3Lin's wide layers or learned positions get `max_sequence_length = L + 4 * steps` so that the
buffers hold the generation.

With `--saved-model`, the same model is also exported as the serving SavedModel
(`elita_tf.export.export_saved_model`, with a SentencePiece model trained on random words) and
its `generate` signature is timed on a prompt of L one-piece words, text in and text out.

With `--litert`, the same model is also exported as LiteRT files (float32 and int8 weights,
`elita_tf.export.export_litert`) and run by the `ai_edge_litert` interpreter: the context is
prefilled (not timed), then each of `steps` decode calls is timed, the state fed back in.

    python benchmarks/decoding.py --architectures elita transformer --contexts 256 4096 16384 --saved-model --litert
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

    from elita_tf.export import LiteRTModel

    model = LiteRTModel(path)
    decode = model.decode
    prefilled = model.prefill(token_ids=np.asarray(prompt, np.int32))  # once: decode leaves its inputs as they are
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


def per_token_ms(make, steps, repeats):
    """`(ms, standard error)`: the slope of wall time against new tokens, over `steps` x 1, 2, 3, 4.

    `make(n)` returns a call that generates `n` tokens. Each count is run
    once first (tracing and compiling for its shape), then `repeats` rounds
    each time every count, in turn.
    """
    import numpy as np

    runs = {n: make(n) for n in (steps, 2 * steps, 3 * steps, 4 * steps)}
    for run in runs.values():
        run()
    counts, seconds = [], []
    for _ in range(repeats):
        for n, run in runs.items():
            start = time.perf_counter()
            run()
            seconds.append(time.perf_counter() - start)
            counts.append(n)
    (slope, _), residuals = np.polyfit(counts, seconds, 1, full=True)[:2]
    spread = np.sum((np.asarray(counts) - np.mean(counts)) ** 2)
    error = np.sqrt(residuals[0] / (len(counts) - 2) / spread) if len(residuals) else 0.0
    return slope * 1e3, error * 1e3


def random_word_tokenizer(vocabulary_size, seed=0):
    """`(proto, word)`: a SentencePiece model of `vocabulary_size` pieces trained on random words, and a word it
    keeps whole."""
    import random

    import sentencepiece

    from elita_tf.data import train_sentencepiece

    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))) for _ in range(4 * vocabulary_size)]
    lines = (" ".join(rng.choice(words) for _ in range(12)) for _ in range(20 * vocabulary_size))
    proto = train_sentencepiece(lines, vocabulary_size=vocabulary_size, seed=seed)
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    whole = [w for w in words if len(processor.encode(w)) == 1]
    return proto, whole[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architectures", nargs="+", default=["elita", "transformer"])
    parser.add_argument("--contexts", nargs="+", type=int, default=[256, 1024, 4096, 16384])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--vocabulary-size", type=int, default=5000)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=6)
    parser.add_argument("--training-length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--saved-model", action="store_true", help="also time the SavedModel's generate")
    parser.add_argument("--litert", action="store_true", help="also time LiteRT float and int8 files")
    args = parser.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    from elita_tf.export import export_litert
    from elita_tf.models import ElitaBackbone, ElitaCausalLM, ElitaCausalLMPreprocessor, ElitaTokenizer

    workdir = tempfile.mkdtemp(prefix="elita-decoding-")

    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, tensorflow {tf.__version__}, keras {keras.__version__}")
    print(
        f"# B={args.batch_size} vocab={args.vocabulary_size} d={args.hidden_dim} L={args.num_layers}, greedy, "
        f"{args.steps} to {4 * args.steps} new tokens, {args.repeats} rounds"
    )
    if args.saved_model:
        import tensorflow_text  # noqa: F401  (registers the SavedModel's tokenizer ops)

        from elita_tf.export import export_saved_model

        proto, word = random_word_tokenizer(args.vocabulary_size)
    columns = ["ElitaCausalLM.generate"]
    columns += ["SavedModel generate"] if args.saved_model else []
    columns += ["LiteRT float", "LiteRT int8"] if args.litert else []
    print("| architecture | context | max_sequence_length | " + " | ".join(f"{c} ms / token" for c in columns) + " |")
    print("|---" * (len(columns) + 3) + "|")
    per_token = {}
    exported = {}  # (architecture, max_sequence_length, quantize) -> file: constant-state models export once
    for context in args.contexts:
        for name in args.architectures:
            size = {"vocabulary_size": args.vocabulary_size, "hidden_dim": args.hidden_dim}
            size.update(num_layers=args.num_layers, max_sequence_length=args.training_length)
            backbone = ElitaBackbone.from_architecture(name, **size)
            if backbone.decode_limit is not None:
                backbone = ElitaBackbone.from_architecture(
                    name, **{**size, "max_sequence_length": context + 4 * args.steps}
                )
            causal_lm = ElitaCausalLM(backbone)
            causal_lm.compile(sampler="greedy")
            prompt = np.random.default_rng(0).integers(3, args.vocabulary_size, size=(args.batch_size, context))

            def through_causal_lm(steps):
                token_ids = np.zeros((args.batch_size, context + steps), "int32")
                token_ids[:, :context] = prompt
                padding_mask = np.zeros_like(token_ids)
                padding_mask[:, :context] = 1
                inputs = {"token_ids": token_ids, "padding_mask": padding_mask}
                return lambda: causal_lm.generate(inputs, stop_token_ids=None)

            def through_saved_model(steps):
                text = tf.constant([" ".join([word] * context)] * args.batch_size)  # `context` tokens
                return lambda: saved_generate(prompts=text, max_new_tokens=tf.constant(steps))["token_ids"].numpy()

            paths = [("causal_lm", through_causal_lm)]
            if args.saved_model:
                directory = os.path.join(workdir, f"saved-{name}-{context}")
                preprocessor = ElitaCausalLMPreprocessor(ElitaTokenizer(proto=proto), sequence_length=context)
                export_saved_model(ElitaCausalLM(backbone, preprocessor), directory)
                saved_generate = tf.saved_model.load(directory).signatures["generate"]
                paths.append(("saved_model", through_saved_model))

            errors = []
            for path, make in paths:
                per_token[name, context, path], error = per_token_ms(make, args.steps, args.repeats)
                errors.append(error)
            cells = [per_token[name, context, path] for path, _ in paths]
            if args.litert:
                for quantize in [None, "int8"]:
                    key = (name, backbone.max_sequence_length, quantize)
                    if key not in exported:
                        path = os.path.join(workdir, f"{len(exported)}.tflite")
                        exported[key] = export_litert(causal_lm, path, quantize=quantize)
                    cells.append(time_litert(exported[key], prompt[:1], args.steps, args.repeats))
            row = " | ".join(
                f"{cell:.2f}" + (f" ± {errors[i]:.2f}" if i < len(errors) else "") for i, cell in enumerate(cells)
            )
            print(f"| {name} | {context} | {backbone.max_sequence_length} | {row} |", flush=True)
    for name in args.architectures:
        rows = [per_token[name, c, "causal_lm"] for c in args.contexts]
        print(f"{name}: ElitaCausalLM.generate ms/token at the longest context / shortest = {rows[-1] / rows[0]:.2f}")


if __name__ == "__main__":
    main()
