"""What each design can recall: every architecture trained on MQAR at several widths, the best of a learning-rate sweep.

    from elita_tf.training.recall import recall_grid
    recall_grid("runs/recall", ["elita", "transformer"])

Zoology's figure 2 (Arora et al., 2023, https://arxiv.org/abs/2312.04927; its
`iclr24_zoology_figure2/configs.py`) under one of two protocols (`RecallSettings.protocol`):
- `"zoology"`, Zoology's own: 2 blocks with no feed-forward network (its state mixer is the
  identity), tied embeddings, dropout 0.1, learned absolute positions only for softmax attention;
  vocabulary 8,192, one fixed set of 100,000 training sequences and 3,000 test ones with zeros
  between the queries, batches of 512 up to T = 128 (256 at 256), widths 64 to 512, the tasks
  T = 64 with 4 pairs, 128 with 8 and 256 with 16, learning rates `logspace(-4, -2, 4)` and 64
  epochs (`ZOOLOGY`). Ours differs in three details: our dropout also acts on each block's output
  (Zoology's on the embeddings and attention weights), our cosine schedule falls every step
  (Zoology's every epoch), and the sequences are our own draws of the same distribution.
- `"cpu"`, the default, at CPU size: each architecture as it is, with its feed-forward network and
  positions, vocabulary 512, width 64, batches of 64, the tasks T = 64 with 4 pairs and 128 with 8
  (Zoology's smaller two, where the Transformer passes on this budget), learning rates 4.6e-4, 1e-3
  and 2.2e-3, and new sequences every epoch: a fixed set of CPU size is memorised (the loss falls
  while test accuracy stays at 1/P).
Both as Zoology's `train.py`: AdamW (weight decay 0.1), a cosine schedule to 0 over the epochs, and
training stops at the end of the first epoch whose test accuracy exceeds 0.99 (`elita_tf.data.mqar`
has the task). A cell's accuracy is the share of the test set's queries whose argmax is their value;
a design's figure at a task and width is the best over the learning rates. Cells train and are scored
on any Keras backend, from NumPy arrays (no TensorFlow on JAX or PyTorch).

Each trained cell is one json file, `OUTPUT_DIR/cells/ARCHITECTURE/T{T}-P{P}/w{W}-lr{LR}.json`,
with every setting and seed: a finished cell is never trained again, so an interrupted grid resumes
where it stopped, and a cell trained with other settings (`RecallSettings.cell_settings`) is refused
rather than reused. A cell in training keeps its last epoch beside it (`w{W}-lr{LR}.partial/`: a
`.keras` checkpoint, model and optimizer, and the epochs' figures), so an interrupted cell resumes at
its last finished epoch, as if never stopped (each epoch's data and order depend only on the seed
and the epoch). Then `OUTPUT_DIR/recall.md` (the table), `OUTPUT_DIR/recall.json` (the best of each
sweep and every cell), `OUTPUT_DIR/recall.png` (accuracy against width, one panel a task, one line
a design, as Zoology's figure 2) and `OUTPUT_DIR/recall-state.png` (accuracy against the bytes of a
sequence's decoding state at the task's length, as Based's figure of recall against state size) are
written.
"""

import dataclasses
import json
import os
import shutil
import time

import numpy as np

from elita_tf.data.mqar import mqar_arrays
from elita_tf.training.recall_settings import DESIGNS, QUICK, SOLVED, ZOOLOGY, RecallSettings  # noqa: F401 (the API)


def cell_path(output_dir, architecture, sequence_length, num_pairs, width, learning_rate):
    """Where the cell's json lives."""
    setting = f"T{sequence_length}-P{num_pairs}"
    return os.path.join(output_dir, "cells", architecture, setting, f"w{width}-lr{learning_rate:g}.json")


def cell_cost(settings, sequence_length, width):
    """A cell's training multiply-adds at most (every epoch): tokens × (blocks' `12 d²` + attention + head)."""
    blocks = settings.num_layers * (12 * width * width + 2 * sequence_length * width)
    per_token = blocks + width * settings.vocabulary_size
    return 3 * settings.epochs * settings.train_examples * sequence_length * per_token


def recall_backbone(architecture, width, sequence_length, settings):
    """A cell's untrained `ElitaBackbone`; `settings` is a `RecallSettings` as a dict (a cell's record holds one).

    Under `protocol="zoology"`, Zoology's figure-2 model: no feed-forward network, tied embeddings, dropout 0.1,
    and learned positions only where the architecture has softmax attention (its mixers' own positions, as
    ELiTA's, stay).
    """
    from elita_tf.models import ElitaBackbone
    from elita_tf.models.architectures import architecture as named

    overrides = {}
    if settings.get("protocol", "cpu") == "zoology":
        config = named(architecture)
        blocks = config.get("blocks", "elita")
        blocks = {blocks} if isinstance(blocks, str) else set(blocks)
        attention = config.get("attention_interval") is not None or bool({"transformer", "simplified"} & blocks)
        overrides = dict(ffn="none", tie_word_embeddings=True, dropout=0.1, position_embedding=attention)
    return ElitaBackbone.from_architecture(
        architecture,
        vocabulary_size=settings["vocabulary_size"],
        hidden_dim=width,
        num_layers=settings["num_layers"],
        num_heads=settings["num_heads"],
        head_dim=width // settings["num_heads"],
        max_sequence_length=sequence_length,
        **overrides,
    )


def decoding_state_bytes(backbone):
    """The bytes of one sequence's decoding cache (`get_initial_cache(1)`): a constant for ELiTA, linear and
    additive blocks, `max_sequence_length` positions for a key/value cache."""
    import keras

    tensors = keras.tree.flatten(backbone.get_initial_cache(1))
    return sum(int(np.prod(t.shape)) * np.dtype(keras.backend.standardize_dtype(t.dtype)).itemsize for t in tensors)


def recall_accuracy(model, arrays, batch_size):
    """The share of the queries (weight > 0) of MQAR `arrays` (`mqar_arrays`) whose argmax is their value, on any
    Keras backend."""
    correct = total = 0
    for first in range(0, len(arrays[0]), batch_size):
        token_ids, targets, weights = (a[first : first + batch_size] for a in arrays)
        logits = np.asarray(model.predict_on_batch(_inputs(token_ids)))  # [B, T, V]
        queries = weights > 0
        correct += int(np.sum(np.argmax(logits[queries], axis=-1) == targets[queries]))
        total += int(np.sum(queries))
    return correct / total


def _inputs(token_ids):
    return {"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}


def epoch_arrays(settings, epoch, batch_size, fixed=None, **task):
    """An epoch's training arrays, `steps × batch_size` rows in its order: new sequences (`protocol` cpu) or the
    `fixed` set's (zoology), shuffled by the seed and the epoch alone, with no TensorFlow."""
    arrays = fixed
    if arrays is None:
        arrays = mqar_arrays(settings.train_examples, seed=(settings.seed, 0, epoch), **task)
    order = np.random.default_rng((settings.seed, 2, epoch)).permutation(len(arrays[0]))
    order = order[: len(order) // batch_size * batch_size]  # whole batches: one compiled step
    return tuple(a[order] for a in arrays)


def read_cell(path):
    """A finished cell's record from its json, or a `ValueError` naming the file."""
    try:
        with open(path) as f:
            record = json.load(f)
    except ValueError as error:
        reason = f"not json: {error}"
    else:
        if isinstance(record, dict) and {"accuracy", "settings"} <= record.keys():
            return record
        reason = "no accuracy and settings in it"
    raise ValueError(f"{path} is not a finished cell's record ({reason}): delete it to train the cell again")


def check_cell_settings(path, recorded, settings):
    """Raises `ValueError` in one line unless a cell's `recorded` settings are `settings`' (`cell_settings`)."""
    wanted = settings.cell_settings()
    # A field added since a cell was trained (`protocol`) meant its default's rules then.
    recorded = {name: recorded.get(name, field.default) for name, field in RecallSettings.__dataclass_fields__.items()}
    differ = sorted(name for name in wanted if recorded[name] != wanted[name])
    if differ:
        then = ", ".join(f"{name}={recorded[name]!r}" for name in differ)
        now = ", ".join(f"{name}={wanted[name]!r}" for name in differ)
        raise ValueError(
            f"{path} was trained with {then}; these settings have {now}. Give another --output-dir, or delete the "
            "cell to train it again"
        )


def train_cell(architecture, width, sequence_length, num_pairs, learning_rate, settings, log=None, checkpoint_dir=None):
    """Trains one architecture at one width, setting and learning rate; returns the cell's record.

    Args:
        log: optional callable taking a line after each epoch.
        checkpoint_dir: optional folder for the last epoch's model, optimizer and figures, written after
            every epoch. A cell started again with the same folder goes on from there.

    Returns:
        A dict: `accuracy` (the last epoch's test accuracy, in [0, 1]), `accuracy_by_epoch`, `solved`,
        `params`, `steps`, `batch_size`, `seconds`, and every setting and seed.
    """
    import keras

    from elita_tf.models import ElitaCausalLM
    from elita_tf.training.checkpoints import load_checkpoint, save_checkpoint
    from elita_tf.training.run_files import checkpoint_path

    task = dict(vocabulary_size=settings.vocabulary_size, sequence_length=sequence_length, num_pairs=num_pairs)
    task.update(power_a=settings.power_a, random_non_queries=settings.random_non_queries)
    batch_size = settings.batch_size_at(sequence_length)
    keras.backend.clear_session()
    keras.utils.set_random_seed(settings.seed)
    progress_path = None if checkpoint_dir is None else os.path.join(checkpoint_dir, "progress.json")
    if progress_path is not None and os.path.exists(progress_path):
        with open(progress_path) as f:
            progress = json.load(f)
        if "settings" in progress:  # written since the settings are checked
            check_cell_settings(checkpoint_dir, progress["settings"], settings)
        by_epoch, losses, seconds = progress["accuracy_by_epoch"], progress["loss_by_epoch"], progress["seconds"]
        # Written before progress.json: the checkpoint of its last epoch is there.
        model = load_checkpoint(checkpoint_path(checkpoint_dir, len(by_epoch)))
        if log is not None:
            log(f"  resumed after epoch {len(by_epoch)} (accuracy {by_epoch[-1]:.3f}), from {checkpoint_dir}")
    else:
        by_epoch, losses, seconds = [], [], 0.0
        model = ElitaCausalLM(recall_backbone(architecture, width, sequence_length, dataclasses.asdict(settings)))
        steps_per_epoch = settings.train_examples // batch_size
        schedule = keras.optimizers.schedules.CosineDecay(learning_rate, settings.epochs * steps_per_epoch)
        model.compile(
            optimizer=keras.optimizers.AdamW(schedule, weight_decay=settings.weight_decay),
            weighted_metrics=None,  # the loss, averaged over the queries: every other position weighs 0
            # Keras leaves XLA off on a CPU; at these sizes it speeds linear and additive attention up most.
            # PyTorch's compiler costs more than it saves there (docs/benchmarks.md).
            jit_compile=keras.backend.backend() != "torch",
        )
    test = mqar_arrays(settings.test_examples, seed=(settings.seed, 1), **task)
    fixed = None  # the cpu protocol's: new sequences every epoch
    if settings.protocol == "zoology":
        fixed = mqar_arrays(settings.train_examples, seed=(settings.seed, 0), **task)
    start = time.perf_counter() - seconds
    while len(by_epoch) < settings.epochs and not (by_epoch and by_epoch[-1] > SOLVED):
        token_ids, targets, weights = epoch_arrays(settings, len(by_epoch), batch_size, fixed, **task)
        history = model.fit(
            _inputs(token_ids), targets, sample_weight=weights, batch_size=batch_size, epochs=1, verbose=0,
            shuffle=False,  # in epoch_arrays' order
        )
        losses.append(float(history.history["loss"][-1]))
        by_epoch.append(recall_accuracy(model, test, batch_size))
        if checkpoint_dir is not None:
            save_checkpoint(model, checkpoint_dir, len(by_epoch), keep=2)
            progress = {"accuracy_by_epoch": by_epoch, "loss_by_epoch": losses, "seconds": time.perf_counter() - start}
            progress["settings"] = settings.cell_settings()
            write_json(progress_path, progress)
        if log is not None:
            log(
                f"  epoch {len(by_epoch)}: loss {losses[-1]:.4f}, accuracy {by_epoch[-1]:.3f}, "
                f"{time.perf_counter() - start:.0f} s"
            )
    return {
        "architecture": architecture,
        "width": width,
        "sequence_length": sequence_length,
        "num_pairs": num_pairs,
        "learning_rate": learning_rate,
        "accuracy": by_epoch[-1],
        "solved": by_epoch[-1] > SOLVED,
        "accuracy_by_epoch": by_epoch,
        "loss_by_epoch": losses,
        "params": model.backbone.count_params(),
        "steps": int(model.optimizer.iterations.numpy()),
        "batch_size": batch_size,
        "seconds": time.perf_counter() - start,
        "jit_compile": bool(model.jit_compile),
        "backend": keras.backend.backend(),
        "settings": dataclasses.asdict(settings),
    }


def write_json(path, content):
    """Writes `content` as json to `path` (its folder made), atomically: a cell is there whole or not at all."""
    from elita_tf.training.run_directory import write_atomically

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_atomically(path, json.dumps(content, indent=1) + "\n")


def _hours(seconds):
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def recall_grid(output_dir, architectures=DESIGNS, settings=None, log=print, time_limit=None):
    """Trains every cell of the grid not yet in `output_dir`, then writes the table, the json and the plot.

    Args:
        output_dir: str. Cells, table, json and plot go here; finished cells are kept and not retrained.
        architectures: names from `elita_tf.models.ARCHITECTURES`.
        settings: `RecallSettings`; None for the defaults.
        log: callable taking a line of progress.
        time_limit: optional seconds: no cell starts after them, and the report covers the finished cells
            (the same call again goes on with the rest).

    Returns:
        `{"best": [...], "cells": [...]}` as written to `recall.json`.
    """
    from elita_tf.models.architectures import architecture

    settings = RecallSettings() if settings is None else settings
    for name in architectures:
        architecture(name)  # unknown names fail before any training
    cells = [  # cell_path's arguments
        (name, sequence_length, num_pairs, width, learning_rate)
        for sequence_length, num_pairs in settings.tasks
        for name in architectures
        for width in settings.widths
        for learning_rate in settings.learning_rates
    ]
    todo = [cell for cell in cells if not os.path.exists(cell_path(output_dir, *cell))]
    records = {}  # every finished cell read and checked before any training
    for cell in cells:
        if cell not in todo:
            path = cell_path(output_dir, *cell)
            records[cell] = read_cell(path)
            check_cell_settings(path, records[cell]["settings"], settings)
    total = sum(cell_cost(settings, cell[1], cell[3]) for cell in todo)
    log(
        f"{len(cells)} cells, {len(cells) - len(todo)} done, {len(todo)} to train: at most {total / 1e12:.1f} "
        "T multiply-adds (early stops cut it)"
    )
    start, done_cost = time.perf_counter(), 0
    for count, cell in enumerate(todo):
        if time_limit is not None and time.perf_counter() - start > time_limit:
            log(f"time limit of {time_limit:g} s: {len(todo) - count} cells not started; the report has the rest")
            break
        name, sequence_length, num_pairs, width, learning_rate = cell
        path = cell_path(output_dir, *cell)
        partial = path.removesuffix(".json") + ".partial"
        record = train_cell(name, width, sequence_length, num_pairs, learning_rate, settings, log, partial)
        records[cell] = record
        write_json(path, record)
        shutil.rmtree(partial)
        done_cost += cell_cost(settings, sequence_length, width)
        elapsed = time.perf_counter() - start
        log(
            f"{name} d={width} T={sequence_length} P={num_pairs} lr={learning_rate:g}: accuracy "
            f"{record['accuracy']:.3f} in {record['steps']} steps, {record['seconds']:.0f} s; "
            f"elapsed {_hours(elapsed)}, at most {_hours(elapsed / done_cost * (total - done_cost))} left"
        )
    return write_report(output_dir, [records[cell] for cell in cells if cell in records])


def best_of_sweep(records):
    """The best learning rate's record of each (architecture, setting, width), in the records' order."""
    best = {}
    for record in records:
        key = (record["architecture"], record["sequence_length"], record["num_pairs"], record["width"])
        if key not in best or record["accuracy"] > best[key]["accuracy"]:
            best[key] = record
    return list(best.values())


def write_report(output_dir, records):
    """Writes `recall.md`, `recall.json`, `recall.png` and `recall-state.png` of the cells' records; returns the
    json's content."""
    # matplotlib, once there is a grid
    from elita_tf.training.recall_report import plot_frontier, plot_recall, recall_table, state_table

    best = best_of_sweep(records)
    for record in best:  # the recall-state frontier: a design's state at the task's length, beside its accuracy
        if "state_bytes" not in record:
            cell = (record["architecture"], record["width"], record["sequence_length"], record["settings"])
            backbone = recall_backbone(*cell)
            record["state_bytes"] = decoding_state_bytes(backbone)
    report = {"best": best, "cells": records}
    write_json(os.path.join(output_dir, "recall.json"), report)
    with open(os.path.join(output_dir, "recall.md"), "w") as f:
        f.write(recall_table(best) + "\nDecoding state per sequence, bytes:\n\n" + state_table(best))
    plot_recall(best, os.path.join(output_dir, "recall.png"))
    plot_frontier(best, os.path.join(output_dir, "recall-state.png"))
    return report
