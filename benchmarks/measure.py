"""Runs one measurement in its own process, so that its peak memory is its own."""

import json
import os
import subprocess
import sys
import time


def rss_mib():
    """The process's resident memory now, in MiB (Linux): the baseline a peak is measured from."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_measurement(cmd, timeout):
    """Runs `cmd`, which prints one JSON line of results.

    A process that fails or times out has the end of its error output copied to this one's, so that a log
    shows where it stopped.

    Returns:
        `(result, None)` with the parsed dict, or `(None, reason)` when the
        process timed out, was killed or printed no result.
    """
    results, reason = run_measurements(cmd, timeout)
    return (results[-1], None) if results else (None, reason)


def run_measurements(cmd, timeout):
    """Runs `cmd`, which prints one JSON line per result; `(results, None)`, or `([], reason)` as `run_measurement`."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
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


def time_left(deadline, timeout, least=60):
    """The seconds a measurement may take: `timeout`, cut so that it ends by `deadline` (a Unix time, or None).

    None when less than `least` seconds are left: the measurement is skipped rather than started, so a lent
    machine's time limit cuts the last (least important) measurements, never one half done.
    """
    if deadline is None:
        return timeout
    left = deadline - time.time()
    return None if left < least else min(timeout, left)


def device_description():
    """The accelerator TensorFlow runs on, in words: the first GPU's name, or "CPU"."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU"
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")


def environment():
    """What a measurement ran on: the device in words, and TensorFlow's and Keras' versions."""
    import keras
    import tensorflow as tf

    return {"device": device_description(), "tensorflow": tf.__version__, "keras": keras.__version__}


def describe_environment(result):
    """A table's last line, from a measurement: the parent process, which prints it, never imports TensorFlow."""
    return f"# measured on {result['device']}, tensorflow {result['tensorflow']}, keras {result['keras']}"


def use_gpu_peak(result):
    """On a GPU, where the tensors live, sets `result["peak_mib"]` to TensorFlow's peak there so far."""
    import tensorflow as tf

    if tf.config.list_logical_devices("GPU"):
        result.update(peak_mib=tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20, peak_memory="gpu")
    return result


def wait_for(outputs):
    """Blocks until every tensor in `outputs` (a nest; None entries skipped) is computed.

    One element of each is read back: it waits for all of it, without a device-to-host copy of the rest.
    """
    import tensorflow as tf

    tf.nest.map_structure(lambda t: None if t is None else tf.reshape(t, [-1])[-1].numpy(), outputs)


def kernel_inputs(batch, heads, length, depth):
    """The causal-mean kernel's inputs: logits `[B, H, T]` (standard deviation 5) and values `[B, H, T, D]`."""
    import tensorflow as tf

    return tf.random.normal([batch, heads, length]) * 5.0, tf.random.normal([batch, heads, length, depth])


def loss_functions(forward, weights=(), jit_compile=False):
    """`(fwd, fwd_bwd)`: `reduce_sum(forward(*inputs))` as a `tf.function`, and that with its gradients.

    `fwd_bwd` returns the loss and its gradients for every input and every tensor of `weights`.
    """
    import tensorflow as tf

    def loss_and_grads(*inputs):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            loss = tf.reduce_sum(forward(*inputs))
        return loss, tape.gradient(loss, list(inputs) + list(weights))

    fwd = tf.function(lambda *inputs: tf.reduce_sum(forward(*inputs)), jit_compile=jit_compile)
    return fwd, tf.function(loss_and_grads, jit_compile=jit_compile)


def training_model(architecture, output_head="chunked", dtype_policy="float32", jit_compile=False, **size):
    """An `ElitaCausalLM` compiled as `elita-train` compiles it: Adam with the ELiTA schedule, the loss alone.

    `size` holds `ElitaBackbone` arguments (`vocabulary_size`, `hidden_dim`, ...). `output_head="full"`
    takes Keras' own step on the `[B, T, V]` logits instead of the chunked loss.
    """
    import keras

    from elita_tf.models import ElitaBackbone, ElitaCausalLM
    from elita_tf.schedules import elita_adam

    causal_lm = ElitaCausalLM(ElitaBackbone.from_architecture(architecture, dtype=dtype_policy, **size))
    causal_lm.compile(
        elita_adam(),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=None,
        jit_compile=jit_compile,
    )
    causal_lm.chunked_loss = output_head == "chunked"
    return causal_lm
