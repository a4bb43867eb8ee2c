"""The tests' view of the Keras backend: tensors in, NumPy out, and gradients, the same on every backend.

The op and layer tests run under `KERAS_BACKEND=tensorflow|jax|torch` (float64 included: JAX's x64
mode is on in the tests). A test that is TensorFlow by nature (tf.data, SavedModel, LiteRT, XLA's
HLO, `tf.distribute`, `tf.function` signatures) carries `@pytest.mark.tf_only` and is skipped elsewhere.
"""

import keras
import numpy as np
from keras import ops

BACKEND = keras.backend.backend()


def tensor(x, dtype=None):
    """A backend tensor of the array `x` (its own dtype unless `dtype` is given)."""
    x = np.asarray(x)
    return ops.convert_to_tensor(x, dtype or x.dtype.name)


def numpy(x):
    """`x` as a NumPy array (float arrays of bfloat16 and float16 widened to float32)."""
    x = ops.convert_to_numpy(x)
    return x.astype(np.float32) if x.dtype.name in ("bfloat16", "float16") else x


def random_normal(shape, seed, dtype="float32", scale=1.0):
    return tensor(np.random.default_rng(seed).normal(size=shape) * scale, dtype)


def _flatten(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def outputs_and_gradients(fn, args, cotangents, variables=()):
    """`fn(*args)`'s outputs (float `args`; anything else `fn` closes over) and the gradients of `Σ_k sum(outputs_k * cotangents_k)` with respect to each
    of `args` and then each Keras variable in `variables`, all as NumPy arrays.

    `fn` returns a tensor or a tuple of them (one cotangent each, `None` to leave one out). Gradients are
    taken by the backend itself: `tf.GradientTape`, `jax.vjp` (variables through a `keras.StatelessScope`)
    or `torch.autograd.grad`. A gradient that does not reach an argument is zeros.
    """
    args = [ops.convert_to_tensor(a) for a in args]
    variables = list(variables)

    def loss_of(outputs):
        total = 0.0
        for out, cot in zip(_flatten(outputs), _flatten(cotangents)):
            if cot is not None:
                dtypes = (keras.backend.standardize_dtype(out.dtype), np.asarray(cot).dtype.name)
                wide = "float64" if "float64" in dtypes else "float32"
                total = total + ops.sum(ops.cast(out, wide) * tensor(cot, wide))
        return total

    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch(args)
            outputs = fn(*args)
            loss = loss_of(outputs)
        grads = tape.gradient(loss, args + [v.value for v in variables])
        grads = [tf.zeros_like(t) if g is None else tf.convert_to_tensor(g) for g, t in zip(grads, args + [v.value for v in variables])]
    elif BACKEND == "jax":
        import jax

        def loss_fn(arg_values, variable_values):
            with keras.StatelessScope(state_mapping=list(zip(variables, variable_values))):
                outputs = fn(*arg_values)
            return loss_of(outputs), outputs

        (_, outputs), (g_args, g_vars) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
            args, [v.value for v in variables]
        )
        grads = list(g_args) + list(g_vars)
    else:
        import torch

        args = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
        outputs = fn(*args)
        loss = loss_of(outputs)
        targets = [a for a in args] + [v.value for v in variables]
        wanted = [t for t in targets if t.requires_grad]
        got = iter(torch.autograd.grad(loss, wanted, allow_unused=True))
        grads = [next(got) if t.requires_grad else None for t in targets]
        grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, targets)]
    outputs = [numpy(o) for o in _flatten(outputs)]
    return outputs, [numpy(g) for g in grads]


def compiled(fn):
    """`fn` compiled as the backend compiles a training step: `tf.function(jit_compile=True)` (XLA), `jax.jit`, or
    on PyTorch `fn` itself (`torch.compile` takes minutes on a CPU; eager is PyTorch's usual form)."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    return fn


def run_on_backend(backend, script, *arguments):
    """Runs the Python `script` with `arguments` in a process of its own on the Keras `backend` (Keras picks its
    backend once, at import); returns its standard output, or fails the test with the end of its errors."""
    import os
    import subprocess
    import sys

    environment = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run(
        [sys.executable, "-c", script, *map(str, arguments)], env=environment, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


# Imports of TensorFlow fail, as on a GPU machine without it (JAX's and PyTorch's own Python).
_NO_TENSORFLOW = """
import sys

class NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_text"):
            raise ImportError(f"no {name} here")

sys.meta_path.insert(0, NoTensorFlow())
"""


def without_tensorflow(folder, backend):
    """An environment for subprocesses on the Keras `backend` in which `import tensorflow` fails (a
    `sitecustomize.py` written to `folder`), checked: a test of it cannot pass with TensorFlow at hand."""
    import os
    import subprocess
    import sys

    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(_NO_TENSORFLOW)
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(folder), "TF_CPP_MIN_LOG_LEVEL": "2"}
    blocked = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env, capture_output=True, text=True)
    assert blocked.returncode and "no tensorflow here" in blocked.stderr, blocked.stderr[-2000:]
    return env
