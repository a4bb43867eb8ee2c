"""`elita-train`: train a decoder language model on WikiText with Keras `fit`.

    elita-train --preset elita --output-dir runs/elita --epochs 3

WikiText is downloaded (and prepared once by tensorflow-datasets) unless `--data-dir` or the
environment variable `ELITA_WIKITEXT_DIR` names a local directory holding its files.

Writes to `--output-dir`: `run.json` (the run's manifest: architecture, training settings,
data and tokenizer hashes), `sentencepiece.model`, `config.json`, `steps.csv` (loss, learning
rate and wall time of every step), `tensorboard/`, `checkpoints/step-N.keras` (model and
optimizer, every `--checkpoint-every` steps and at each epoch end; the last
`--keep-checkpoints` kept) and `results.json` (validation and test loss and perplexity, step
time, tokens/s, peak memory, the data's SHA-256). Run the same command again after an
interruption and it resumes exactly where the last intact checkpoint left off: same step, same
data position, same result as an uninterrupted run. A directory holding another run (other
arguments, data or tokenizer), or one another elita-train is writing, is refused before anything
in it changes.
"""

import argparse
import csv
import hashlib
import json
import math
import os
import resource
import subprocess
import sys
import time

import keras
import tensorflow as tf

from elita_tf.data import lm_dataset, load_wikitext, make_tokenizer, steps_per_epoch, token_windows, train_sentencepiece
from elita_tf.data.wikitext import CONFIG_NAMES, DATA_DIR_ENV, split_files
from elita_tf.models import PRESETS, build_decoder, preset
from elita_tf.schedules import elita_adam
from elita_tf.training import (
    CorruptCheckpointError,
    RunDirectory,
    RunDirectoryError,
    load_latest_checkpoint,
    save_checkpoint,
    write_atomically,
)

STRATEGIES = ("default", "mirrored", "multiworker")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="elita-train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="elita", help=f"one of {sorted(PRESETS)}")
    parser.add_argument(
        "--data-dir",
        default=os.environ.get(DATA_DIR_ENV) or None,
        help=f"local WikiText directory (wiki.*.tokens or .raw); defaults to ${DATA_DIR_ENV}; else downloads",
    )
    parser.add_argument("--dataset", default="wikitext-2-v1", choices=CONFIG_NAMES)
    parser.add_argument("--tfds-dir", help="where tensorflow-datasets keeps prepared data")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--vocab-size", type=int, default=5000)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, help="stop after this many steps in all (a token budget)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--keep-checkpoints", type=int, default=2, help="how many of the newest checkpoints to keep")
    parser.add_argument(
        "--force-new", action="store_true", help="discard the run already in --output-dir instead of resuming it"
    )
    parser.add_argument("--eval-batches", type=int, help="cap on validation/test batches (default: all)")
    parser.add_argument("--strategy", default="default", choices=STRATEGIES)
    parser.add_argument("--verbose", type=int, default=1, help="Keras fit verbosity (1: progress bar)")
    args = parser.parse_args(argv)
    if args.preset not in PRESETS:
        parser.error(f"unknown preset {args.preset!r}; choose one of {sorted(PRESETS)}")
    if args.seq_len < 2:
        parser.error(f"--seq-len must be at least 2, got {args.seq_len}")
    positive = ["vocab_size", "batch_size", "epochs", "checkpoint_every", "keep_checkpoints", "width", "layers"]
    positive += ["heads", "head_dim", "max_steps", "eval_batches"]
    for name in positive:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    if not 0.0 <= args.dropout < 1.0:
        parser.error(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.seed < 0:
        parser.error(f"--seed must be non-negative, got {args.seed}")
    if args.verbose not in (0, 1, 2):
        parser.error(f"--verbose must be 0, 1 or 2, got {args.verbose}")
    if args.data_dir is not None:
        try:
            split_files(args.data_dir, args.dataset)
        except FileNotFoundError as error:
            parser.error(str(error))
    return args


def _strategy(name):
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multiworker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def software_versions():
    """The package version and commit (when it runs from a git checkout), TensorFlow and Keras versions."""
    import elita_tf

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=os.path.dirname(os.path.abspath(elita_tf.__file__)),
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if (
            commit
            and subprocess.run(
                ["git", "diff", "--quiet", "HEAD"], cwd=os.path.dirname(os.path.abspath(elita_tf.__file__))
            ).returncode
        ):
            commit += "-dirty"  # uncommitted changes: the commit alone does not reproduce the run
    except OSError:
        commit = ""
    return {
        "elita_tf": elita_tf.__version__,
        "commit": commit or None,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "python": sys.version.split()[0],
    }


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def model_config(args):
    return preset(
        args.preset,
        vocab_size=args.vocab_size,
        width=args.width,
        num_layers=args.layers,
        num_heads=args.heads,
        head_dim=args.head_dim,
        context_length=args.seq_len,
        dropout=args.dropout,
    )


def requested_manifest(args, config, data):
    """What makes this run this run: a resumed run must match it field by field."""
    return {
        "preset": args.preset,
        "model": config.get_config(),
        "data": {"dataset": data["dataset"], "sha256": data["sha256"]},
        "training": {"seq_len": args.seq_len, "batch_size": args.batch_size, "seed": args.seed},
    }


def prepare_run(args, run_dir):
    """Checks the directory against the request, then the tokenizer and the windows of the three splits.

    A new run trains the tokenizer and writes `run.json` and `config.json`; a
    resumed one reuses its tokenizer after checking its hash. Returns
    `(config, windows, data)`.
    """
    splits, data = load_wikitext(args.dataset, local_dir=args.data_dir, tfds_dir=args.tfds_dir, with_info=True)
    config = model_config(args)
    manifest = requested_manifest(args, config, data)
    stored = run_dir.check_manifest(manifest)
    tokenizer_path = run_dir.file("sentencepiece.model")
    if stored is None:
        lines = (line.decode("utf-8") for line in splits["train"].as_numpy_iterator())
        proto = train_sentencepiece(lines, vocab_size=args.vocab_size, seed=args.seed)
        write_atomically(tokenizer_path, proto)
        write_atomically(run_dir.file("config.json"), config.to_json())
        run_dir.write_manifest({**manifest, "tokenizer_sha256": _sha256(proto)})
    else:
        proto = open(tokenizer_path, "rb").read() if os.path.exists(tokenizer_path) else b""
        if _sha256(proto) != stored["tokenizer_sha256"]:
            raise RunDirectoryError(
                f"{tokenizer_path} is missing or is not the tokenizer this run was trained with "
                f"(sha256 {stored['tokenizer_sha256'][:12]}...). Restore it, or use --force-new."
            )
    tokenizer = make_tokenizer(proto)
    windows = {
        split: token_windows(lines, tokenizer, args.seq_len, vocabulary_size=args.vocab_size)
        for split, lines in splits.items()
    }
    return config, windows, data


class StepLog(keras.callbacks.Callback):
    """One CSV row per step: global step, loss, learning rate, wall time; keeps step times.

    On resuming from step `start_step`, rows logged after it (steps redone
    since the checkpoint) are dropped and the wall clock continues.
    """

    FIELDS = ["step", "loss", "learning_rate", "wall_time_s", "step_time_s"]

    def __init__(self, path, start_time, start_step=0):
        super().__init__()
        self.path = path
        self.step_times = []  # this process's steps, the first of each fit (tracing) left out
        self.load = []  # the machine's 1-minute load average, sampled every 10 steps
        rows = []
        if os.path.exists(path):
            with open(path) as f:
                rows = [row for row in csv.DictReader(f) if int(row["step"]) <= start_step]
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, self.FIELDS)
            writer.writeheader()
            writer.writerows(rows)
        self.start_time = start_time - (float(rows[-1]["wall_time_s"]) if rows else 0.0)

    def on_train_begin(self, logs=None):
        self.file = open(self.path, "a", newline="")
        self.writer = csv.writer(self.file)
        self.last = time.perf_counter()
        self.first = True

    def on_epoch_begin(self, epoch, logs=None):
        self.running_mean = 0.0

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        optimizer = self.model.optimizer
        step = int(optimizer.iterations.numpy())
        lr = float(optimizer.learning_rate)
        # Keras reports the epoch's running mean; this batch's own loss is the difference.
        loss = (batch + 1) * logs["loss"] - batch * self.running_mean
        self.running_mean = logs["loss"]
        self.writer.writerow(
            [step, f"{loss:.6f}", f"{lr:.6g}", f"{now - self.start_time:.3f}", f"{now - self.last:.4f}"]
        )
        self.file.flush()
        if not self.first:
            self.step_times.append(now - self.last)
        if step % 10 == 0:
            self.load.append(os.getloadavg()[0])
        self.first = False
        self.last = now

    def on_train_end(self, logs=None):
        self.file.close()


class Checkpoint(keras.callbacks.Callback):
    """Saves model and optimizer every `every` steps and at epoch ends (`save_checkpoint`)."""

    def __init__(self, run_dir, every, keep):
        super().__init__()
        self.run_dir, self.every, self.keep = run_dir, every, keep
        self.saved_step = None

    def save(self):
        step = int(self.model.optimizer.iterations.numpy())
        if step != self.saved_step:
            save_checkpoint(self.model, self.run_dir, step, keep=self.keep)
            self.saved_step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) % self.every == 0:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        self.save()


def run(args, callbacks=()):
    """Trains (or resumes) as `args` says; returns the results dict. `callbacks` are added to fit.

    Holds the run directory's lock throughout.

    Raises:
        RunDirectoryError: the directory holds another run, is in use, or cannot be written.
        CorruptCheckpointError: every checkpoint of the run is corrupt.
    """
    with RunDirectory(args.output_dir, force_new=args.force_new) as run_dir:
        return _train(args, run_dir, callbacks)


def _train(args, run_dir, callbacks):
    keras.utils.set_random_seed(args.seed)
    config, windows, data = prepare_run(args, run_dir)
    per_epoch = steps_per_epoch(windows["train"], args.batch_size)
    total = args.epochs * per_epoch if args.max_steps is None else min(args.max_steps, args.epochs * per_epoch)

    strategy = _strategy(args.strategy)
    with strategy.scope():
        model, checkpoint = load_latest_checkpoint(run_dir.path)
        if model is None:
            model = build_decoder(config, name=args.preset)
            model.compile(
                optimizer=elita_adam(),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=[],
            )
    start = int(model.optimizer.iterations.numpy())
    if start:
        print(f"Resuming {args.preset} from step {start} ({checkpoint})", flush=True)

    def evaluation(split):
        data = lm_dataset(windows[split], args.batch_size, shuffle=False)
        if args.eval_batches:
            data = data.take(args.eval_batches)
        return data

    step_log = StepLog(os.path.join(args.output_dir, "steps.csv"), time.perf_counter(), start)
    fit_callbacks = [
        step_log,
        Checkpoint(run_dir.path, args.checkpoint_every, args.keep_checkpoints),
        keras.callbacks.TensorBoard(os.path.join(args.output_dir, "tensorboard"), update_freq=args.checkpoint_every),
        *callbacks,
    ]
    step = start
    while step < total:
        epoch = step // per_epoch
        # A resumed epoch first runs its remaining steps, then epochs are whole again.
        steps = min(per_epoch - step % per_epoch, total - step)
        model.fit(
            lm_dataset(windows["train"], args.batch_size, seed=args.seed, epochs=None, start_step=step),
            initial_epoch=epoch,
            epochs=epoch + 1,
            steps_per_epoch=steps,
            validation_data=evaluation("validation"),
            callbacks=fit_callbacks,
            shuffle=False,  # the stream is shuffled by its seed
            verbose=args.verbose,
        )
        step += steps

    results = {
        "preset": args.preset,
        "seed": args.seed,
        "steps": total,
        "params": model.count_params(),
        "replicas": strategy.num_replicas_in_sync,
        "data": data,
        "config": {"model": config.get_config(), "arguments": vars(args)},
        "software": software_versions(),
    }
    for split in ["validation", "test"]:
        loss = float(model.evaluate(evaluation(split), verbose=0))
        results[f"{split}_loss"] = loss
        results[f"{split}_perplexity"] = math.exp(loss)
    if step_log.step_times:
        results["step_time_s"] = sum(step_log.step_times) / len(step_log.step_times)
        results["tokens_per_s"] = args.batch_size * args.seq_len / results["step_time_s"]
    results["peak_memory_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # A figure taken while other work shared the cores says so here.
    load = step_log.load or [os.getloadavg()[0]]
    results["load_average"] = {"mean": sum(load) / len(load), "max": max(load), "cpus": os.cpu_count()}
    write_atomically(os.path.join(args.output_dir, "results.json"), json.dumps(results, indent=2))
    print(json.dumps(results, indent=2), flush=True)
    return results


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except (RunDirectoryError, CorruptCheckpointError) as error:
        print(f"elita-train: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
