"""GPU setup check: products against float64, the kernel and the two ELiTA layers against the CPU."""

import numpy as np
import tensorflow as tf

from elita_tf import layers
from elita_tf.ops import causal_softmax_mean

print("tf", tf.__version__, tf.config.list_physical_devices("GPU"))
info = tf.sysconfig.get_build_info()
print("built for cuda", info.get("cuda_version"), "cudnn", info.get("cudnn_version"))
rng = np.random.default_rng(0)

a, b = rng.standard_normal((512, 256)), rng.standard_normal((256, 384))
exact = a @ b
for dtype in (tf.float32, tf.bfloat16):
    with tf.device("/GPU:0"):
        got = tf.matmul(tf.cast(a, dtype), tf.cast(b, dtype))
    err = np.abs(tf.cast(got, tf.float64).numpy() - exact).max() / np.abs(exact).max()
    print("matmul", dtype.name, "rel err", err)


def kernel_grads(logits, values, upstream, jit):
    @tf.function(jit_compile=jit)
    def f(l, v):
        with tf.GradientTape() as tape:
            tape.watch([l, v])
            mean, _, _ = causal_softmax_mean(l, v)
            loss = tf.reduce_sum(mean * tf.cast(upstream, mean.dtype))
        return (mean, *tape.gradient(loss, [l, v]))

    return [t.numpy().astype(np.float64) for t in f(logits, values)]


B, H, T, D = 2, 4, 4096, 64
for scale in (3.0, 60.0):  # 60: logits rising far past one chunk's normaliser
    logits = rng.standard_normal((B, H, T)) * scale
    values = rng.standard_normal((B, H, T, D))
    upstream = rng.standard_normal((B, H, T, D))
    with tf.device("/CPU:0"):
        ref = kernel_grads(tf.constant(logits), tf.constant(values), upstream, False)
    for jit in (False, True):
        with tf.device("/GPU:0"):
            got = kernel_grads(tf.constant(logits, tf.float32), tf.constant(values, tf.float32), upstream, jit)
        errs = [np.abs(g - r).max() / max(np.abs(r).max(), 1e-30) for g, r in zip(got, ref)]
        finite = all(np.isfinite(g).all() for g in got)
        print(
            f"kernel logit scale {scale} jit {jit}: rel err mean {errs[0]:.2e} d_logits {errs[1]:.2e} "
            f"d_values {errs[2]:.2e} finite {finite}"
        )


def layer_grads(layer, x, device, jit):
    with tf.device(device):

        @tf.function(jit_compile=jit)
        def f(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x)
                loss = tf.reduce_sum(y * y)
            grads = tape.gradient(loss, [x] + layer.trainable_variables)
            return [y] + grads

        return [t.numpy().astype(np.float64) for t in f(tf.identity(x))]


x = tf.constant(rng.standard_normal((4, 256, 64)), tf.float32)
for name, layer in (("Attention2", layers.Attention2(4, 16, position_dim=16)), ("FeedForward2", layers.FeedForward2())):
    layer.build(x.shape)
    ref = layer_grads(layer, x, "/CPU:0", False)
    for jit in (False, True):
        got = layer_grads(layer, x, "/GPU:0", jit)
        worst = max(np.abs(g - r).max() / max(np.abs(r).max(), 1e-30) for g, r in zip(got, ref))
        print(f"{name} jit {jit}: output and {len(got) - 1} gradients, worst rel err vs CPU {worst:.2e}")
