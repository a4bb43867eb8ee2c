"""Every command ends an error on one line (`elita-<cmd>: error: ...`, exit status 2), a traceback only with --debug."""

import errno
import importlib
import os
import subprocess
import sys
import types

import pytest

from elita_tf.cli.errors import run_command


def _raise(error):
    def body():
        raise error

    return body


@pytest.mark.parametrize(
    "error, line",
    [
        (
            ValueError("bad value.\n  Received: x=1"),
            "elita-x: error: bad value. Received: x=1 (--debug shows the traceback)",
        ),
        (
            OSError(errno.ENOSPC, "No space left on device", "/runs/a/ckpt"),
            "elita-x: error: OSError: [Errno 28] No space left on device: '/runs/a/ckpt' (--debug shows the traceback)",
        ),
        (
            subprocess.CalledProcessError(1, ["elita-train", "--architecture", "elita"]),
            "elita-x: error: `elita-train --architecture elita` failed with exit status 1; its error is above "
            "(--debug shows the traceback)",
        ),
        (PermissionError(errno.EACCES, "Permission denied", "/out"), "elita-x: error: PermissionError: [Errno 13]"),
    ],
)
def test_an_error_is_one_line_with_status_2(error, line, capsys):
    assert run_command("elita-x", _raise(error)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(line) and "Traceback" not in err


def test_debug_lets_the_error_through_and_ctrl_c_says_how_to_resume(capsys):
    with pytest.raises(ValueError, match="bad"):
        run_command("elita-x", _raise(ValueError("bad")), debug=True)
    assert run_command("elita-x", _raise(KeyboardInterrupt()), resume_hint="Run it again to resume.") == 130
    assert capsys.readouterr().err == "elita-x: interrupted. Run it again to resume.\n"
    assert run_command("elita-x", lambda: 0) == 0


def test_a_command_s_error_reaches_the_shell_as_one_line(tmp_path):
    # A real command, in its own process: a run directory that does not exist.
    command = [sys.executable, "-m", "elita_tf.cli.export", "--run-dir", str(tmp_path / "none"), "--output", "x"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("elita-export")]
    assert len(lines) == 1 and lines[0].startswith("elita-export: error: ") and "Traceback" not in done.stderr, (
        done.stderr
    )


@pytest.mark.parametrize("command", ["evaluate", "export"])
def test_tensorflow_starts_without_lines_a_user_cannot_act_on(tmp_path, command):
    # The user's environment, without the tests' TF_CPP_MIN_LOG_LEVEL: TensorFlow's C++ start-up lines
    # (twice; cuInit's failure where there is no GPU) and grain's jax profiler warning stay out.
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    argv = ["--run-dir", str(tmp_path / "none")] + (["--output", str(tmp_path / "out")] if command == "export" else [])
    done = subprocess.run([sys.executable, "-m", f"elita_tf.cli.{command}", *argv], capture_output=True, text=True, env=env)
    assert done.returncode == 2
    assert done.stderr.startswith(f"elita-{command}: error: ") and done.stderr.count("\n") == 1, done.stderr


# What TensorFlow writes when it cannot start (an unknown XLA flag, a broken CUDA set-up), and then exits.
FATAL = "F0000 00:00:1796160691.296166    3914 parse_flags_from_env.cc:234] Unknown flag in TF_XLA_FLAGS: --bogus\n"
# oneDNN's notice that it leaves int64 ops to Eigen, written at the first of them, long after start-up.
ONEDNN = (
    "E0000 00:00:1796160838.549872    5009 util.cc:131] oneDNN supports DT_INT64 only on platforms with AVX-512. "
    "Falling back to the default Eigen-based implementation if present.\n"
)


def test_a_user_s_own_log_level_stays():
    from elita_tf.cli.quiet import without_noise

    start_up = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1795833553.642125    6769 cpu_feature_guard.cc:227] This TensorFlow binary is optimized\n"
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow.\n"
        "E0000 00:00:1795833572.668231    6844 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error\n"
        "2024-05-01 10:00:00.123456: E external/cuda_driver.cc:282] failed call to cuInit: UNKNOWN ERROR (303)\n"
        "2024-05-01 10:00:00.123457: E external/cuda_fft.cc:467] Unable to register cuFFT factory: Attempting to\n"
        + ONEDNN
        + "E0000 00:00:1795833572.668231    6844 gpu_device.cc:52] something else\n"
        "a line of Python's\n"
        + FATAL
    )
    assert without_noise(start_up, 0) == start_up
    assert without_noise(start_up, 2) == start_up.split("\n", 7)[-1]  # the older TensorFlow's lines too
    assert without_noise(start_up, 3) == "a line of Python's\n" + FATAL  # a fatal line at any level


def test_a_fatal_start_up_error_reaches_the_user(tmp_path):
    # TensorFlow's fatal log ends the process as it writes: nothing of it may wait to be written back.
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    command = [sys.executable, "-m", "elita_tf.cli.evaluate", "--run-dir", str(tmp_path / "none")]
    done = subprocess.run(command, capture_output=True, text=True, env={**env, "TF_XLA_FLAGS": "--bogus"})
    assert done.returncode != 0 and "Unknown flag in TF_XLA_FLAGS: --bogus" in done.stderr, done


def test_the_filter_copies_lines_through_as_they_come_and_all_it_holds_when_the_process_dies():
    # No TensorFlow: the filter alone, and a process that exits without running Python's exit handlers.
    script = (
        "import os, sys\n"
        "from elita_tf.cli.quiet import filter_stderr\n"
        "filter_stderr()\n"
        "for line in sys.argv[1:]:\n"
        "    os.write(2, line.encode())\n"
        "os._exit(1)\n"
    )
    noise = "I0000 00:00:1796160684.604682    3914 port.cc:153] oneDNN custom operations are on.\n"
    lines = [noise, ONEDNN, "\rGenerating splits...:   0%|          | 0/3\r      \r", ONEDNN, FATAL, "half a line"]
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", script, *lines], capture_output=True, env=env)
    # A progress bar's line left at its start is no cover for a log line after it.
    assert done.returncode == 1 and done.stderr.decode() == lines[2] + FATAL + "half a line", done


def test_tensorflow_datasets_own_notice_of_our_wikitext_config_stays_out(caplog):
    import logging

    from elita_tf.cli.quiet import quiet_start_up

    quiet_start_up()
    absl = logging.getLogger("absl")
    absl.warning("Using custom data configuration: %s", "WikitextConfig(name='wikitext-2-v1-local-bcee55ae')")
    absl.warning("Another warning")
    assert [record.getMessage() for record in caplog.records] == ["Another warning"]


@pytest.mark.parametrize(
    "command, argv",
    [
        ("train", ["--output-dir", "run", "--no-such-flag"]),
        ("train", []),  # --output-dir is required
        ("train", ["--output-dir", "run", "--strategy", "tpu"]),
        ("train", ["--output-dir", "run", "--epochs", "two"]),
        ("train", ["--output-dir", "run", "--batch-size", "0"]),
        ("train", ["--output-dir", "run", "--vocabulary-size", "2"]),  # below what SentencePiece trains
        ("train", ["--output-dir", "run", "--byte-fallback", "--vocabulary-size", "100"]),  # no room for its 256 bytes
        ("compare", ["--output-dir", "runs", "--no-such-flag"]),
        ("compare", ["--seeds", "0"]),
        ("compare", ["--output-dir", "runs", "--optimizer", "sgd"]),
        ("compare", ["--output-dir", "runs", "--seeds", "a"]),
        ("compare", ["--output-dir", "runs", "--batch-size", "0"]),
        ("evaluate", ["--run-dir", "run", "--no-such-flag"]),
        ("evaluate", ["--split", "test"]),
        ("evaluate", ["--run-dir", "run", "--split", "dev"]),
        ("evaluate", ["--run-dir", "run", "--batch-size", "many"]),
        ("evaluate", ["--run-dir", "run", "--batch-size", "0"]),
        ("evaluate", ["--run-dir", "run", "--batch-size", str(2**31)]),
        ("evaluate", ["--run-dir", "run", "--sequence-length", str(2**31)]),
        ("export", ["--run-dir", "run", "--output", "out", "--no-such-flag"]),
        ("export", ["--run-dir", "run"]),
        ("export", ["--run-dir", "run", "--output", "out", "--format", "onnx"]),
        ("export", ["--run-dir", "run", "--output", "out", "--max-new-tokens", "ten"]),
        ("export", ["--run-dir", "run", "--output", "out", "--max-new-tokens", "0"]),
    ],
)
def test_a_flag_error_is_one_line_without_the_usage(command, argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(f"elita_tf.cli.{command}").main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"elita-{command}: error: ") and "usage:" not in err, err
    assert os.listdir(tmp_path) == []  # refused before anything is written


@pytest.mark.parametrize("command", ["train", "compare", "evaluate", "export"])
def test_help_still_prints_the_whole_usage(command, capsys):
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(f"elita_tf.cli.{command}").main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: elita-{command}") and "--debug" in out and out.count("\n") > 10


def test_a_callable_hint_is_read_at_the_interrupt(capsys):
    state = {"hint": "before"}

    def body():  # what the run saved changes while it runs: the hint is the state at the interrupt
        state["hint"] = "after"
        raise KeyboardInterrupt

    assert run_command("elita-x", body, resume_hint=lambda: state["hint"]) == 130
    assert capsys.readouterr().err == "elita-x: interrupted. after\n"


def test_ctrl_c_says_resume_only_once_a_checkpoint_exists(tmp_path, monkeypatch, capsys):
    from elita_tf.cli import train as train_cli
    from elita_tf.data.sources import DATA_DIR_ENV

    monkeypatch.delenv(DATA_DIR_ENV, raising=False)  # no WikiText files to check before the run
    # The loop stands in without TensorFlow: Ctrl-C while tokenizing, before any checkpoint.
    loop = types.ModuleType("elita_tf.training.loop")
    monkeypatch.setitem(sys.modules, "elita_tf.training.loop", loop)
    run = tmp_path / "run"

    def interrupted(settings):
        raise KeyboardInterrupt

    loop.train = interrupted
    assert train_cli.main(["--output-dir", str(run)]) == 130
    err = capsys.readouterr().err
    assert err == "elita-train: interrupted. Nothing was saved yet: run the same command to start again.\n"
    # A half-written checkpoint is no checkpoint either.
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step-00000005.keras.tmp.keras").write_bytes(b"")
    assert train_cli.main(["--output-dir", str(run)]) == 130
    assert "Nothing was saved yet" in capsys.readouterr().err

    def after_a_checkpoint(settings):
        (run / "checkpoints" / "step-00000005.keras").write_bytes(b"")
        raise KeyboardInterrupt

    loop.train = after_a_checkpoint
    assert train_cli.main(["--output-dir", str(run)]) == 130
    err = capsys.readouterr().err
    assert err == f"elita-train: interrupted. The run's last checkpoint is in {run}: run the same command to resume.\n"
