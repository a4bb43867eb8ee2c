"""`elita-train --strategy multiworker` with real worker processes: a two-task cluster on 127.0.0.1."""

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from elita_tf.training import list_checkpoints

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 300
# Multi-worker runs equal the single process up to float32 summation order: a few 1e-6 relative.
ROUND_OFF = 2e-5


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _args(data_dir, out, *extra):
    flags = {
        "--data-dir": data_dir,
        "--output-dir": str(out),
        "--vocabulary-size": 60,
        "--sequence-length": 16,
        "--batch-size": 8,
        "--hidden-dim": 16,
        "--num-layers": 1,
        "--num-heads": 2,
        "--head-dim": 8,
        "--epochs": 50,
        "--max-steps": 30,
        "--checkpoint-every": 5,
        "--eval-batches": 2,
        "--verbose": 0,
    }
    return [str(item) for pair in flags.items() for item in pair] + [str(item) for item in extra]


def _launch(args, index=None, ports=None, log=None):
    """One `elita-train` process; with `index`, worker `index` of a two-worker TF_CONFIG cluster."""
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    if index is not None:
        cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        args = [*args, "--strategy", "multiworker"]
    return subprocess.Popen(
        [sys.executable, "-m", "elita_tf.cli.train", *args],
        cwd=REPO,
        env=env,
        stdout=log or subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(processes):
    """Waits for every process (bounded); returns their outputs, killing all if one hangs."""
    outputs = []
    deadline = time.time() + TIMEOUT_S
    try:
        for proc in processes:
            outputs.append(proc.communicate(timeout=max(1, deadline - time.time()))[0] or "")
    except subprocess.TimeoutExpired:
        for proc in processes:
            proc.kill()
        pytest.fail(f"a worker did not finish within {TIMEOUT_S} s")
    return outputs


def _two_workers(args):
    ports = _free_ports(2)
    return [_launch(args, index, ports) for index in range(2)]


def _losses(run_dir):
    with open(os.path.join(run_dir, "steps.csv")) as f:
        rows = list(csv.DictReader(f))
    return [int(row["step"]) for row in rows], np.array([float(row["loss"]) for row in rows])


@pytest.fixture(scope="module")
def single_process(tiny_wikitext, tmp_path_factory):
    """The same run in one process, without a strategy: the reference for every multi-worker run."""
    out = tmp_path_factory.mktemp("single") / "run"
    (output,) = _finish([_launch(_args(tiny_wikitext, out))])
    with open(out / "results.json") as f:
        return out, json.load(f), output


def test_two_workers_train_the_single_process_run(tiny_wikitext, tmp_path, single_process):
    reference_dir, reference, _ = single_process
    out = tmp_path / "run"
    processes = _two_workers(_args(tiny_wikitext, out))
    outputs = _finish(processes)
    assert [proc.returncode for proc in processes] == [0, 0], "\n\n".join(o[-3000:] for o in outputs)

    with open(out / "results.json") as f:
        results = json.load(f)
    assert results["replicas"] == 2 and reference["replicas"] == 1
    steps, losses = _losses(out)
    reference_steps, reference_losses = _losses(reference_dir)
    assert steps == reference_steps == list(range(1, 31))
    # Each worker took half of every global batch: together, the single process's batches. What differs
    # is the order of float32 sums (the all-reduce): measured 2.7e-6 over the 30 losses, 7e-8 on the test loss.
    np.testing.assert_allclose(losses, reference_losses, rtol=ROUND_OFF)
    np.testing.assert_allclose(results["test_loss"], reference["test_loss"], rtol=ROUND_OFF)
    # The chief alone wrote the run; the other worker's files went to a scratch directory it deleted.
    assert sorted(os.listdir(out)) == sorted(os.listdir(reference_dir))
    assert "| elita | 0 |" in outputs[0] and "| elita |" not in outputs[1]  # the chief alone prints the results


def test_a_killed_worker_is_relaunched_and_the_run_finishes_exactly(tiny_wikitext, tmp_path, single_process):
    reference_dir, reference, _ = single_process
    out = tmp_path / "run"
    args = _args(tiny_wikitext, out, "--checkpoint-every", "2")
    with open(tmp_path / "first.log", "w") as log:
        ports = _free_ports(2)
        chief, worker = [_launch(args, index, ports, log=log) for index in range(2)]
        deadline = time.time() + TIMEOUT_S
        while not list_checkpoints(out) and worker.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        assert worker.returncode == -signal.SIGKILL, "the worker ended before it could be killed"
        # TensorFlow's peer health checks abort the chief's collectives: it stops by itself, with an error.
        try:
            chief.wait(timeout=120)
        except subprocess.TimeoutExpired:
            chief.kill()
            pytest.fail("the chief did not stop after its peer died")
        assert chief.returncode not in (0, None)
    checkpoint_step = list_checkpoints(out)[-1][0]
    assert 2 <= checkpoint_step < 30, (tmp_path / "first.log").read_text()[-3000:]

    processes = _two_workers(args)  # the same command, relaunched
    outputs = _finish(processes)
    assert [proc.returncode for proc in processes] == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
    assert f"from step {checkpoint_step}" in outputs[0]
    steps, losses = _losses(out)
    assert steps == list(range(1, 31))  # each step once: the steps redone after the checkpoint replace theirs
    np.testing.assert_allclose(losses, _losses(reference_dir)[1], rtol=ROUND_OFF)  # measured: 1.4e-6
    with open(out / "results.json") as f:
        np.testing.assert_allclose(json.load(f)["test_loss"], reference["test_loss"], rtol=ROUND_OFF)


def test_workers_launched_with_different_arguments_stop_with_the_reason(tiny_wikitext, tmp_path):
    ports = _free_ports(2)
    out = tmp_path / "run"
    processes = [_launch(_args(tiny_wikitext, out, "--seed", str(index)), index, ports) for index in range(2)]
    outputs = _finish(processes)
    assert [proc.returncode for proc in processes] == [2, 2]
    for output in outputs:
        assert "The workers disagree on arguments" in output, output[-3000:]
    assert not list_checkpoints(out)
