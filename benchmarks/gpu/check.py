"""Does this device compute our ops correctly? Matrix products against float64, and the causal-mean kernel and
ELiTA's two layers (outputs and every gradient, with and without XLA) against float64 on the CPU.

Prints one JSON line per check and exits 1 if any is off by more than its bound (TF32 products, the default for
float32 on an NVIDIA GPU since Ampere, carry about 3 significant digits) or is not finite.

    python benchmarks/gpu/check.py [--quick] [--out FILE]
"""

import argparse
import json
import sys

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes (seconds on a CPU)")
    parser.add_argument("--out", help="also append the JSON lines to this file")
    args = parser.parse_args()

    import tensorflow as tf

    from elita_tf import layers
    from elita_tf.ops import causal_softmax_mean

    device = "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"
    rng = np.random.default_rng(0)
    results = []

    def report(check, errors, finite, bound):
        worst = max(errors)
        result = {"check": check, "device": device, "worst_rel_err": worst, "finite": finite, "bound": bound}
        result["ok"] = bool(finite and worst <= bound)
        results.append(result)
        print(json.dumps(result), flush=True)

    def relative(got, want):
        return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))

    a, b = rng.standard_normal((512, 256)), rng.standard_normal((256, 384))
    for dtype, bound in ((tf.float32, 1e-2), (tf.bfloat16, 3e-2)):
        with tf.device(device):
            got = tf.cast(tf.matmul(tf.cast(a, dtype), tf.cast(b, dtype)), tf.float64).numpy()
        report(f"matmul {dtype.name}", [relative(got, a @ b)], bool(np.isfinite(got).all()), bound)

    def run(fn, inputs, on, jit):
        with tf.device(on):

            @tf.function(jit_compile=jit)
            def f(*inputs):
                with tf.GradientTape() as tape:
                    tape.watch(inputs)
                    outputs, loss = fn(*inputs)
                return [outputs, *tape.gradient(loss, list(inputs) + fn.variables)]

            return [t.numpy().astype(np.float64) for t in f(*inputs)]

    batch, heads, length, depth = (1, 2, 256, 16) if args.quick else (2, 4, 4096, 64)
    for scale in (3.0, 60.0):  # 60: logits rising far past a chunk's first normaliser
        logits = rng.standard_normal((batch, heads, length)) * scale
        values = rng.standard_normal((batch, heads, length, depth))
        upstream = rng.standard_normal((batch, heads, length, depth))

        def kernel(l, v):
            mean = causal_softmax_mean(l, v)[0]
            return mean, tf.reduce_sum(mean * tf.cast(upstream, mean.dtype))

        kernel.variables = []
        want = run(kernel, [tf.constant(logits), tf.constant(values)], "/CPU:0", False)  # float64
        for jit in (False, True):
            got = run(kernel, [tf.constant(logits, tf.float32), tf.constant(values, tf.float32)], device, jit)
            errors = [relative(g, w) for g, w in zip(got, want)]
            report(f"causal_softmax_mean scale={scale} xla={jit}", errors, all(np.isfinite(g).all() for g in got), 1e-2)

    x = rng.standard_normal((2 if args.quick else 4, 64 if args.quick else 256, 64))
    for name, make in (
        ("Attention2", lambda dtype: layers.Attention2(4, 16, position_dim=16, dtype=dtype)),
        ("FeedForward2", lambda dtype: layers.FeedForward2(dtype=dtype)),
    ):
        reference = make("float64")
        reference.build(x.shape)
        layer = make("float32")
        layer.build(x.shape)
        layer.set_weights(reference.get_weights())

        def forward(inputs, layer=None):
            y = layer(inputs)
            return y, tf.reduce_sum(y * y)

        def bound_to(layer):
            fn = lambda inputs: forward(inputs, layer)  # noqa: E731
            fn.variables = layer.trainable_variables
            return fn

        want = run(bound_to(reference), [tf.constant(x)], "/CPU:0", False)
        for jit in (False, True):
            got = run(bound_to(layer), [tf.constant(x, tf.float32)], device, jit)
            errors = [relative(g, w) for g, w in zip(got, want)]
            report(f"{name} xla={jit}", errors, all(np.isfinite(g).all() for g in got), 1e-2)

    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in results)
    bad = [r["check"] for r in results if not r["ok"]]
    if bad:
        print(f"check.py: {len(bad)} of {len(results)} checks failed: {bad}", file=sys.stderr)
        sys.exit(1)
    print(f"check.py: all {len(results)} checks passed on {device}")


if __name__ == "__main__":
    main()
