"""Runs one measurement in its own process, so that its peak memory is its own."""

import collections
import json
import os
import subprocess
import sys
import time


def rss_mib():
    """The process's resident memory now, in MiB (Linux): the baseline a peak is measured from."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_measurement(cmd, timeout, env=None):
    """Runs `cmd` (with the environment `env`, or this process's), which prints one JSON line of results.

    A process that fails or times out has the end of its error output copied to this one's, so that a log
    shows where it stopped.

    Returns:
        `(result, None)` with the parsed dict, or `(None, reason)` when the
        process timed out, was killed or printed no result.
    """
    results, reason = run_measurements(cmd, timeout, env)
    return (results[-1], None) if results else (None, reason)


def run_measurements(cmd, timeout, env=None):
    """Runs `cmd`, which prints one JSON line per result; `(results, None)`, or `([], reason)` as `run_measurement`."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as stopped:
        stderr = stopped.stderr or b""
        stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
        print(f"{' '.join(cmd)}: timed out after {timeout:.0f} s; its last output:\n{stderr[-3000:]}", file=sys.stderr)
        return [], f"timed out after {timeout:.0f} s"
    if proc.returncode:
        print(f"{' '.join(cmd)}: exit status {proc.returncode}:\n{proc.stderr[-3000:]}", file=sys.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode < 0:
        return [], f"killed by signal {-proc.returncode} (out of memory?)"
    if proc.returncode or not lines:
        return [], (proc.stderr.strip().splitlines() or ["failed"])[-1][:80]
    return [json.loads(line) for line in lines], None


def alive_at_peak(events):
    """`(peak bytes, [(bytes, owner)])`: the allocations alive when the total allocated was highest.

    `events`: `(address, bytes, owner)` in time order; positive bytes allocate at the address, anything else
    frees what is there (a free of what was allocated before the events began is not counted). Two passes: the
    peak's place, then the allocations replayed up to it (no copy of the live set at every new high).
    """
    live, total, peak, peak_at = {}, 0, 0, -1
    for i, (address, size, _) in enumerate(events):
        if size > 0:
            live[address] = size
            total += size
            if total > peak:
                peak, peak_at = total, i
        elif address in live:
            total -= live.pop(address)
    live = {}
    for address, size, owner in events[: peak_at + 1]:
        if size > 0:
            live[address] = (size, owner)
        else:
            live.pop(address, None)
    return peak, list(live.values())


def most_common(names):
    """The most common of the non-empty `names`, or ""."""
    counts = collections.Counter(name for name in names if name)
    return counts.most_common(1)[0][0] if counts else ""


def op_names(names, operands):
    """Each HLO instruction's op name: its own (`names`: `{id: name or ""}`), else its operands' most common one
    (`operands`: `{id: [operand ids]}`), else its users'. XLA's own instructions (a copy, a layout change) have
    none."""
    users = collections.defaultdict(list)
    for instruction, inputs in operands.items():
        for operand in inputs:
            users[operand].append(instruction)
    return {
        i: names[i] or most_common(names.get(o, "") for o in operands[i]) or most_common(names[u] for u in users[i])
        for i in names
    }


def time_left(deadline, timeout, least=60):
    """The seconds a measurement may take: `timeout`, cut so that it ends by `deadline` (a Unix time, or None).

    None when less than `least` seconds are left: the measurement is skipped rather than started, so a lent
    machine's time limit cuts the last (least important) measurements, never one half done.
    """
    if deadline is None:
        return timeout
    left = deadline - time.time()
    return None if left < least else min(timeout, left)


def _backend():
    import keras

    return keras.backend.backend()


def device_description():
    """The accelerator Keras' backend runs on, in words: the first GPU's name, or "CPU"."""
    backend = _backend()
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return "CPU" if device.platform == "cpu" else device.device_kind
    if backend == "torch":
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU"
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")


def environment():
    """What a measurement ran on: the device in words, the Keras backend and its version, and Keras' version."""
    import importlib

    import keras

    backend = _backend()
    version = importlib.import_module(backend).__version__
    result = {"device": device_description(), "backend": backend, "backend_version": version}
    if backend == "tensorflow":
        result["tensorflow"] = version
    return {**result, "keras": keras.__version__}


def describe_environment(result):
    """A table's last line, from a measurement: the parent process, which prints it, imports no backend."""
    backend = result.get("backend", "tensorflow")
    version = result.get("backend_version", result.get("tensorflow"))
    return f"# measured on {result['device']}, {backend} {version}, keras {result['keras']}"


def use_gpu_peak(result):
    """On a GPU, where the tensors live, sets `result["peak_mib"]` to the backend's peak there so far."""
    backend = _backend()
    peak = None
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform != "cpu":
            peak = device.memory_stats()["peak_bytes_in_use"]
    elif backend == "torch":
        import torch

        if torch.cuda.is_available():
            peak = torch.cuda.max_memory_allocated()
    else:
        import tensorflow as tf

        if tf.config.list_logical_devices("GPU"):
            peak = tf.config.experimental.get_memory_info("GPU:0")["peak"]
    if peak is not None:
        result.update(peak_mib=peak / 2**20, peak_memory="gpu")
    return result


class _TensorMemory:
    """The backend allocator's peak, reset after the first (compiling) step: the steps' own tensors."""

    def __init__(self, reset, peak):
        self.reset, self._peak = reset, peak

    def peak_mib(self):
        return self._peak() / 2**20


def tensor_memory():
    """The allocator's peak with a reset, where the backend keeps one: TensorFlow's (on a CPU too, unless XLA's
    own CPU runtime holds the tensors) and PyTorch's on a GPU; None elsewhere (JAX cannot reset its peak)."""
    backend = _backend()
    if backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return None
        return _TensorMemory(torch.cuda.reset_peak_memory_stats, torch.cuda.max_memory_allocated)
    if backend != "tensorflow":
        return None
    import tensorflow as tf

    device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    try:
        tf.config.experimental.get_memory_info(device)
    except ValueError:
        return None
    return _TensorMemory(
        lambda: tf.config.experimental.reset_memory_stats(device),
        lambda: tf.config.experimental.get_memory_info(device)["peak"],
    )


def torch_cpu_tensor_peak_mib(step):
    """The most memory tensors held at once during one `step()` on PyTorch's CPU, from the profiler's allocation
    events, above what was allocated before it (the weights and the optimizer's state): PyTorch's CPU allocator
    keeps no peak of its own, and the resident set size measures the C library's allocator as much as the model."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as trace:
        step()
    events = trace.profiler.kineto_results.events()
    events = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = peak = 0
    for _, size in events:
        live += size
        peak = max(peak, live)
    return peak / 2**20


def synthetic_batch(batch_size, sequence_length, vocabulary_size):
    """`(x, y)` of random token ids as `elita-train` feeds them, on the device of Keras' backend: NumPy's draws
    (seed 0), so no backend needs TensorFlow for them."""
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (batch_size, sequence_length)
    token_ids = rng.integers(0, vocabulary_size, size=shape).astype("int32")
    x = {"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}
    y = rng.integers(0, vocabulary_size, size=shape).astype("int32")
    return keras.tree.map_structure(keras.ops.convert_to_tensor, x), keras.ops.convert_to_tensor(y)


def wait_for(outputs):
    """Blocks until every tensor in `outputs` (a nest; None entries skipped) is computed.

    One element of each is read back: it waits for all of it, without a device-to-host copy of the rest.
    """
    import keras
    from keras import ops

    if _backend() == "tensorflow":
        import tensorflow as tf

        tf.nest.map_structure(lambda t: None if t is None else tf.reshape(t, [-1])[-1].numpy(), outputs)
        return
    keras.tree.map_structure(lambda t: None if t is None else ops.convert_to_numpy(ops.reshape(t, [-1])[-1]), outputs)


def kernel_inputs(batch, heads, length, depth):
    """The causal-mean kernel's inputs: logits `[B, H, T]` (standard deviation 5) and values `[B, H, T, D]`."""
    if _backend() == "tensorflow":
        import tensorflow as tf

        return tf.random.normal([batch, heads, length]) * 5.0, tf.random.normal([batch, heads, length, depth])
    import keras

    return (
        keras.random.normal([batch, heads, length], seed=0) * 5.0,
        keras.random.normal([batch, heads, length, depth], seed=1),
    )


def loss_functions(forward, weights=(), jit_compile=False, cotangent=None):
    """`(fwd, fwd_bwd)`: `sum(forward(*inputs))`, and that with its gradients, compiled as the backend compiles.

    `fwd_bwd` returns the loss and its gradients for every input and every tensor of `weights`. On
    TensorFlow `tf.function`s (XLA with `jit_compile`); on JAX `jax.jit` always (the weights enter through a
    `keras.StatelessScope`); on PyTorch eager autograd (`torch.compile` with `jit_compile`).

    With a float32 `cotangent` shaped like the outputs the loss is `sum(outputs * cotangent)`, so that the
    backward pass starts from a dense gradient, as inside a model. A plain sum's gradient is ones, which
    PyTorch broadcasts with zero strides, and some of its kernels then take slow paths (FeedForward2's
    backward pass at the seed width: 160 ms against 102 ms from a dense gradient).
    """
    backend = _backend()
    if backend == "jax":
        return _jax_loss_functions(forward, list(weights), cotangent)
    if backend == "torch":
        return _torch_loss_functions(forward, list(weights), jit_compile, cotangent)
    import tensorflow as tf

    def loss(*inputs):
        outputs = forward(*inputs)
        return tf.reduce_sum(outputs if cotangent is None else tf.cast(outputs, tf.float32) * cotangent)

    def loss_and_grads(*inputs):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            value = loss(*inputs)
        return value, tape.gradient(value, list(inputs) + list(weights))

    fwd = tf.function(loss, jit_compile=jit_compile)
    return fwd, tf.function(loss_and_grads, jit_compile=jit_compile)


def _jax_loss_functions(forward, weights, cotangent):
    import jax
    import jax.numpy as jnp
    import keras

    def loss(values, inputs):
        with keras.StatelessScope(state_mapping=list(zip(weights, values))):
            outputs = forward(*inputs).astype(jnp.float32)
            return jnp.sum(outputs if cotangent is None else outputs * cotangent)

    values = [w.value for w in weights]
    fwd_jit = jax.jit(loss)
    fwd_bwd_jit = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

    def fwd_bwd(*inputs):
        value, (d_weights, d_inputs) = fwd_bwd_jit(values, list(inputs))
        return value, list(d_inputs) + list(d_weights)

    return (lambda *inputs: fwd_jit(values, list(inputs))), fwd_bwd


def _torch_loss_functions(forward, weights, jit_compile, cotangent):
    import torch

    def loss(*inputs):
        outputs = forward(*inputs).float()
        return torch.sum(outputs if cotangent is None else outputs * cotangent)

    def fwd(*inputs):
        with torch.no_grad():
            return loss(*inputs)

    def loss_and_grads(*inputs):
        inputs = [x.detach().requires_grad_(True) for x in inputs]
        value = loss(*inputs)
        return value, torch.autograd.grad(value, inputs + [w.value for w in weights], allow_unused=True)

    if jit_compile:
        return torch.compile(fwd), torch.compile(loss_and_grads)
    return fwd, loss_and_grads


def training_model(
    architecture, output_head="chunked", dtype_policy="float32", jit_compile=False, package="elita_tf", **size
):
    """An `ElitaCausalLM` compiled as `elita-train` compiles it: Adam with the ELiTA schedule, the loss alone.

    `size` holds `ElitaBackbone` arguments (`vocabulary_size`, `hidden_dim`, ...). `output_head="full"`
    takes Keras' own step on the `[B, T, V]` logits instead of the chunked loss. `package` is the package
    to build it from (`benchmarks/ab.py` builds another checkout's, renamed).
    """
    import importlib

    import keras

    models = importlib.import_module(f"{package}.models")
    elita_adam = importlib.import_module(f"{package}.schedules").elita_adam

    causal_lm = models.ElitaCausalLM(models.ElitaBackbone.from_architecture(architecture, dtype=dtype_policy, **size))
    causal_lm.compile(
        elita_adam(),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=None,
        jit_compile=jit_compile,
    )
    causal_lm.chunked_loss = output_head == "chunked"
    return causal_lm
