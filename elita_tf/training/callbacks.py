"""The training loop's callbacks: a row of `steps.csv` per step, checkpoints, and the progress bar."""

import csv
import os
import time

import keras

from elita_tf.training.checkpoints import save_checkpoint


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

    def on_train_batch_begin(self, batch, logs=None):
        # The rate this step takes: after it, the optimizer reports the next step's.
        self.learning_rate = float(self.model.optimizer.learning_rate)

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        optimizer = self.model.optimizer
        step = int(optimizer.iterations.numpy())
        lr = self.learning_rate
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


class EpochProgress(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, its epochs numbered out of the run's `epochs`.

    The loop calls `fit` once per epoch, and Keras numbers each call's epochs out of that call's own
    `epochs`: it printed `Epoch 2/2`, `Epoch 3/3` and never `Epoch 1/...`.
    """

    def __init__(self, epochs):
        super().__init__()
        self.run_epochs = epochs

    def set_params(self, params):
        super().set_params(params)
        self.epochs = self.run_epochs
