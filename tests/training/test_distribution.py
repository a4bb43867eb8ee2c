"""Past one device through `keras.distribution` on JAX: data parallel, model parallel (`ElitaBackbone.get_layout_map`)
and both, in the Python API and in `elita-train`, on 4 XLA host devices of the CPU; each backend's strategies.

The multi-device cases run in a process of their own: XLA makes its host devices when JAX starts.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from elita_tf.models.architectures import ARCHITECTURES
from elita_tf.training.distributed import join_processes
from elita_tf.training.settings import train_settings
from tests.backend_utils import BACKEND, run_on_backend
from tests.conftest import DESIGNS, TINY_RUN, write_documents

_FOUR_DEVICES = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import contextlib, json, sys
import keras, numpy as np
devices = keras.distribution.list_devices()
assert len(devices) == 4, devices
"""

# Each architecture trained 4 steps from the same weights on one device, data parallel over 4 and on a (2, 2) mesh;
# the losses, which weights the mesh cuts and how, and the sharded model's preset loaded on one device.
_MODELS = _FOUR_DEVICES + """
from elita_tf.models import ElitaBackbone, ElitaCausalLM, architecture_config
from elita_tf.schedules import elita_adam
preset_dir, names = sys.argv[1], sys.argv[2:]
rng = np.random.default_rng(0)
ids = rng.integers(0, 64, (8, 16)).astype("int32")
batch = ({"token_ids": ids, "padding_mask": np.ones_like(ids)}, np.roll(ids, -1, axis=1))
sizes = dict(vocabulary_size=64, hidden_dim=32, num_layers=2, num_heads=4, head_dim=8, max_sequence_length=16)
mesh = keras.distribution.DeviceMesh((2, 2), ("batch", "model"), devices)
report = {}
for name in names:
    keras.utils.set_random_seed(0)
    weights = ElitaBackbone.from_architecture(name, **sizes).get_weights()
    layout_map = ElitaBackbone.get_layout_map(mesh, config=architecture_config(name, **sizes))
    runs = {}
    for label, distribution in [
        ("one", None),
        ("data", keras.distribution.DataParallel(devices=devices)),
        ("mesh", keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")),
    ]:
        with contextlib.nullcontext() if distribution is None else distribution.scope():
            model = ElitaCausalLM(ElitaBackbone.from_architecture(name, **sizes))
            model.backbone.set_weights(weights)
            model.compile(optimizer=elita_adam(), weighted_metrics=None)
            runs[label] = [float(model.train_on_batch(*batch)) for _ in range(4)]
    cut = {}
    for variable in model.backbone.weights:  # the mesh's model
        shards = variable.value.addressable_shards
        assert sorted(str(shard.device) for shard in shards) == sorted(str(d) for d in mesh.devices.flatten())
        layout = layout_map[variable.path]
        want = list(variable.shape)
        if layout is not None:
            want = [size // 2 if axis == "model" else size for size, axis in zip(want, layout.axes)]
            cut[variable.path] = list(layout.axes)
        assert all(list(shard.data.shape) == want for shard in shards), (variable.path, want)
    model.backbone.save_to_preset(f"{preset_dir}/{name}")
    hidden = model.backbone.predict_on_batch(batch[0])
    loaded = ElitaBackbone.from_preset(f"{preset_dir}/{name}")  # one device, no distribution
    assert np.allclose(loaded.predict_on_batch(batch[0]), hidden, rtol=1e-5, atol=1e-5)
    report[name] = {"losses": runs, "cut": cut}
print(json.dumps(report))
"""

# Each block type, and two in one model; every architecture with ELITA_JAX_TESTS=all (tests/conftest.py).
_NAMES = list(ARCHITECTURES) if os.environ.get("ELITA_JAX_TESTS") == "all" else [*DESIGNS, "elita-hybrid"]


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution's model parallelism runs on JAX")
def test_data_and_model_parallel_train_as_one_device_and_the_mesh_holds_its_parts(tmp_path):
    report = json.loads(run_on_backend("jax", _MODELS, tmp_path, *_NAMES).strip().splitlines()[-1])
    for name in _NAMES:
        losses = report[name]["losses"]
        for label in ("data", "mesh"):
            assert losses[label] == pytest.approx(losses["one"], rel=1e-4), (name, label)
        assert losses["one"][-1] < losses["one"][0]  # it trained
        cut = report[name]["cut"]
        # The vocabulary, and each block's heads or hidden features, on the model axis.
        assert cut["token_embedding/embeddings"] == ["model", None] and cut["logits/kernel"] == [None, "model"]
        assert all(any(path.startswith(f"block_{i}/mixer/") for path in cut) for i in range(2)), name
    elita, hybrid = report["elita"]["cut"], report["elita-hybrid"]["cut"]
    assert elita["block_0/mixer/value/kernel"] == ["model", None, None]  # [H, d, D]: by heads
    assert elita["block_0/ffn/w3/kernel"] == ["model", None, None]
    assert hybrid["block_0/mixer/attention/query/kernel"] == [None, "model", None]  # the first block: [d, H, D]
    assert report["linear"]["cut"]["block_0/mixer/value/kernel"] == [None, "model", None]


# ELiTA's training step on a (1, 4) mesh, with XLA's optimized programs written to a folder; a vocabulary (1000) that
# no other size of the model shares.
_LOGITS = """
import os, sys
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=4 --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*train_step.* "
    f"--xla_dump_to={sys.argv[1]}"
)
import keras, numpy as np
from elita_tf.models import ElitaBackbone, ElitaCausalLM, architecture_config
from elita_tf.schedules import elita_adam
sizes = dict(vocabulary_size=1000, hidden_dim=32, num_layers=2, num_heads=4, head_dim=8, max_sequence_length=64)
mesh = keras.distribution.DeviceMesh((1, 4), ("batch", "model"), keras.distribution.list_devices())
layout_map = ElitaBackbone.get_layout_map(mesh, config=architecture_config("elita", **sizes))
with keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch").scope():
    model = ElitaCausalLM(ElitaBackbone.from_architecture("elita", **sizes))
    model.compile(optimizer=elita_adam(), weighted_metrics=None)
    ids = np.random.default_rng(0).integers(0, 1000, (8, 64)).astype("int32")
    model.train_on_batch({"token_ids": ids, "padding_mask": np.ones_like(ids)}, ids)
"""


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution's model parallelism runs on JAX")
def test_on_the_model_axis_no_device_gathers_the_logits(tmp_path):
    run_on_backend("jax", _LOGITS, tmp_path)
    (program,) = tmp_path.glob("*train_step*after_optimizations.txt")
    collectives = re.findall(
        r"= \(?([^=]*?)\)? (all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(?:-start)?\(",
        program.read_text(),
    )
    assert any(kind == "all-reduce" for _, kind in collectives)  # the partial sums of the cut layers meet
    # No collective moves a tensor along the whole vocabulary: each device keeps its quarter of every logit row.
    shapes = [shape for shape, _ in collectives]
    assert not [shape for shape in shapes if re.search(r"[\[,]1000[\],]", shape)], shapes


_TRAIN = _FOUR_DEVICES + """
import io
from elita_tf.cli.train import main
out, tiny = sys.argv[1], sys.argv[2:]
results = {}
def train(run, *flags):
    error = io.StringIO()
    with contextlib.redirect_stderr(error):
        try:
            status = main(["--output-dir", f"{out}/{run}", *tiny, *flags])
        except SystemExit as exit:  # a flag refused while parsing
            status = exit.code
    return status, error.getvalue().strip().splitlines()
for run, flags in [
    ("one", ["--max-steps", "4"]),
    ("one, longer", ["--max-steps", "24", "--epochs", "100"]),
    ("data", ["--max-steps", "2", "--strategy", "data-parallel"]),
    ("mesh", ["--max-steps", "4", "--model-parallel", "2"]),
]:
    assert train(run, *flags)[0] == 0
    results[run] = json.load(open(f"{out}/{run}/results.json"))
assert train("data", "--max-steps", "4")[0] == 0  # the data-parallel run resumes on one device
results["resumed"] = json.load(open(f"{out}/data/results.json"))
refused = {}
for run, flags in [
    ("odd-batch", ["--strategy", "data-parallel", "--batch-size", "6"]),
    ("three", ["--model-parallel", "3"]),
    ("heads", ["--model-parallel", "4", "--num-heads", "2"]),
    ("tensorflow's", ["--strategy", "mirrored"]),
]:
    status, lines = train(run, *flags)
    refused[run] = [status, lines, os.path.exists(f"{out}/{run}")]
print(json.dumps({"results": results, "refused": refused}))
"""


def _two_processes(run, tiny, logs):
    """`elita-train` data parallel in two JAX processes of 2 host devices each, on localhost, each writing its output
    to `logs/process-{i}.log`: the processes."""
    with socket.socket() as free:
        free.bind(("localhost", 0))
        port = free.getsockname()[1]
    command = [sys.executable, "-c", "import sys; from elita_tf.cli.train import main; sys.exit(main())"]
    command += ["--output-dir", str(run), *tiny, "--max-steps", "24", "--epochs", "100", "--checkpoint-every", "2"]
    processes = []
    for index in range(2):
        environment = dict(
            os.environ,
            KERAS_BACKEND="jax",
            TF_CPP_MIN_LOG_LEVEL="3",
            XLA_FLAGS="--xla_force_host_platform_device_count=2",
            KERAS_DISTRIBUTION_JOB_ADDRESSES=f"localhost:{port}",
            KERAS_DISTRIBUTION_NUM_PROCESSES="2",
            KERAS_DISTRIBUTION_PROCESS_ID=str(index),
        )
        with open(logs / f"process-{index}.log", "w") as log:
            output = {"stdout": log, "stderr": subprocess.STDOUT}
            processes.append(subprocess.Popen([*command, "--strategy", "data-parallel"], env=environment, **output))
    return processes


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution runs on JAX")
def test_elita_train_on_devices_and_processes_follows_one_device_resumes_and_refuses_bad_meshes(tmp_path):
    data = write_documents(tmp_path / "texts", 40)
    tiny = [*TINY_RUN, "--num-layers", "2", "--data", data, "--holdout-fraction", "0.15"]
    report = json.loads(run_on_backend("jax", _TRAIN, tmp_path / "runs", *tiny).strip().splitlines()[-1])

    # Two processes: the second is killed once the first checkpoint is written, then both are launched again.
    run = tmp_path / "two-processes"
    first = _two_processes(run, tiny, tmp_path)
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / "step-00000002.keras").exists():
        assert time.monotonic() < deadline and first[0].poll() is None, (tmp_path / "process-0.log").read_text()
        time.sleep(0.2)
    first[1].send_signal(signal.SIGKILL)
    try:  # JAX's coordination service ends the other, or the test does
        first[0].wait(timeout=30)
    except subprocess.TimeoutExpired:
        first[0].kill()
    for process in first:
        process.wait()
    assert not (run / "results.json").exists()
    again = _two_processes(run, tiny, tmp_path)
    codes = [process.wait(timeout=300) for process in again]
    outputs = [(tmp_path / f"process-{index}.log").read_text() for index in range(2)]
    assert codes == [0, 0], [output[-3000:] for output in outputs]
    resumed = re.search(r"Resuming elita from step (\d+)", outputs[0])
    assert resumed and 2 <= int(resumed[1]) < 24 and "Resuming" not in outputs[1], outputs  # the chief speaks
    report["results"]["two processes"] = json.loads((run / "results.json").read_text())
    results = report["results"]
    one = results["one"]
    assert (one["replicas"], one["devices"]) == (1, 1)
    assert (results["mesh"]["replicas"], results["mesh"]["devices"]) == (2, 4)
    assert (results["two processes"]["replicas"], results["two processes"]["devices"]) == (4, 4)
    assert results["two processes"]["steps"] == results["one, longer"]["steps"] == 24
    for run, reference in [("mesh", one), ("resumed", one), ("two processes", results["one, longer"])]:
        for key in ("validation_loss", "test_loss"):
            assert results[run][key] == pytest.approx(reference[key], rel=1e-4), (run, key)
    assert results["data"]["devices"] == 4 and results["data"]["steps"] == 2
    assert results["resumed"]["steps"] == 4
    refused = report["refused"]
    expected = {
        "odd-batch": "The global batch must split evenly over the 4 devices of the data axis. Received: batch_size=6",
        "three": "The model axis must divide the 4 devices",
        "heads": "of 4 devices must divide num_heads, which it cuts (`ElitaBackbone.get_layout_map`). "
        "Received: num_heads=2",
        "tensorflow's": "On jax, `strategy` must be one of ['default', 'data-parallel']",
    }
    for run, (status, lines, written) in refused.items():
        assert status == 2 and len(lines) == 1 and expected[run] in lines[0], (run, lines)
        assert not written, run


def test_each_backend_refuses_the_other_backends_strategies_in_one_line(tmp_path, monkeypatch):
    others = {
        "tensorflow": ["data-parallel"],
        "jax": ["mirrored", "multiworker"],
        "torch": ["mirrored", "multiworker", "data-parallel"],
    }[BACKEND]
    for strategy in others:
        with pytest.raises(ValueError, match=rf"On {BACKEND}, `strategy` must be one of .*strategy='{strategy}'"):
            train_settings(output_dir=str(tmp_path / "run"), strategy=strategy)
    if BACKEND != "jax":
        with pytest.raises(ValueError, match=rf"`model_parallel` must be None on {BACKEND}.*model_parallel=2"):
            train_settings(output_dir=str(tmp_path / "run"), model_parallel=2)
    # Keras' variables of several JAX processes, where nothing would join them.
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "2")
    with pytest.raises(ValueError, match=r"KERAS_DISTRIBUTION_NUM_PROCESSES join a run of several JAX processes"):
        join_processes(train_settings(output_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()
