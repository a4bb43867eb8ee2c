"""The training loop: an `ElitaCausalLM` of a named architecture, fitted on a corpus, resumable exactly.

    from elita_tf.training import TrainSettings, train
    results = train(TrainSettings("runs/elita", architecture="elita", epochs=2))
    results = train(TrainSettings("runs/mine", data="my-texts/*.txt"))

The corpus is WikiText-2 unless `data` names another (`elita_tf.data.load_corpus`). WikiText is
downloaded (and prepared once by tensorflow-datasets) unless `data_dir` or the environment
variable `ELITA_WIKITEXT_DIR` names a local directory holding its files. The text is read and
checked before the run directory is touched: bad input leaves nothing behind.

A run directory (`RunDirectory`) keeps the training state apart from the model it publishes:

    run.json              the manifest: architecture, training settings, data and tokenizer hashes
    sentencepiece.model   the tokenizer, trained on the train split
    steps.csv             loss, learning rate and wall time of every step
    tensorboard/          TensorBoard logs
    checkpoints/          step-N.keras: model, optimizer (and carried state), every
                          `checkpoint_every` steps and at each epoch end; the last few kept
    results.json          validation and test loss and perplexity, step time, tokens/s, peak memory,
                          the data's SHA-256, versions and load
    preset/               at the end: the trained model as a keras-hub preset, nothing else
                          (`ElitaCausalLM.from_preset(run_dir)` loads it; `keras_hub.upload_preset` publishes it)

Training again into the same directory resumes exactly where the last intact checkpoint left
off: same step, same data position, same result as an uninterrupted run. A directory holding
another run (other settings, data or tokenizer), or one another process is writing, is refused
before anything in it changes. `elita-train` (`elita_tf.cli.train`) is the command line.
"""

import csv
import dataclasses
import functools
import hashlib
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

from elita_tf.data import (
    lm_dataset,
    load_corpus,
    make_tokenizer,
    sample_text,
    steps_per_epoch,
    stream_dataset,
    stream_steps_per_epoch,
    train_sentencepiece,
)
from elita_tf.data.token_files import FileWindows, cache_root, fingerprint, write_token_file
from elita_tf.models import ElitaBackbone, ElitaCausalLM
from elita_tf.models.architectures import ARCHITECTURES, architecture, decode_limit
from elita_tf.models.elita_backbone import architecture_config
from elita_tf.models.presets import read_preset_config, resolve_preset
from elita_tf.schedules import elita_adam, three_lin_sgd
from elita_tf.training.checkpoints import load_latest_checkpoint, save_checkpoint
from elita_tf.training.distributed import (
    adapt_to_multi_worker,
    check_workers_agree,
    distributed_dataset,
    in_multi_worker_mode,
    make_strategy,
)
from elita_tf.training.run_directory import (
    TOKENIZER,
    RunDirectory,
    RunDirectoryError,
    check_writable,
    save_run_preset,
    write_atomically,
)


def software_versions():
    """The package version and commit (when it runs from a git checkout), TensorFlow and Keras versions."""
    import elita_tf

    def git(*command):
        source = os.path.dirname(os.path.abspath(elita_tf.__file__))
        return subprocess.run(["git", *command], cwd=source, capture_output=True, text=True, timeout=10)

    try:
        commit = git("rev-parse", "HEAD").stdout.strip()
        if commit and git("diff", "--quiet", "HEAD").returncode:
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


def model_config(settings):
    """The run's architecture: `ElitaBackbone` arguments, its recipe at the run's size."""
    overrides = {
        "vocabulary_size": settings.vocabulary_size,
        "hidden_dim": settings.hidden_dim,
        "num_layers": settings.num_layers,
        "num_heads": settings.num_heads,
        "head_dim": settings.head_dim,
        "max_sequence_length": settings.sequence_length,
        "dropout": settings.dropout,
    }
    if settings.position_mode is not None:
        overrides["position_mode"] = settings.position_mode
    return architecture_config(settings.architecture, **overrides)


# The settings that shape the model: a fine-tuned run takes them from the model it starts from.
MODEL_FIELDS = (
    "architecture",
    "vocabulary_size",
    "hidden_dim",
    "num_layers",
    "num_heads",
    "head_dim",
    "sequence_length",
    "dropout",
    "position_mode",
)


def preset_architecture(preset):
    """`(recipe name, architecture)` of the model in a run directory or keras-hub preset.

    The architecture is complete (`architecture_config`'s fields), whatever the preset's age.

    Raises:
        ValueError: when the preset is not an ELiTA model's, or its model is none of
            `ARCHITECTURES` at any size.
    """
    config = read_preset_config(resolve_preset(preset))
    size = ("vocabulary_size", "hidden_dim", "num_layers", "num_heads", "head_dim", "max_sequence_length")
    overrides = {key: config[key] for key in (*size, "dropout", "position_mode") if key in config}
    for name in ARCHITECTURES:
        try:
            candidate = architecture_config(name, **overrides)
        except ValueError:
            continue
        if all(config.get(key, value) == value for key, value in candidate.items()):
            return name, candidate
    raise ValueError(f"The model in {preset!r} is none of the architectures {sorted(ARCHITECTURES)}.")


def init_from_settings(settings, given=None):
    """`settings` with the model fields (`MODEL_FIELDS`) of the model `settings.init_from` names.

    Args:
        settings: a `TrainSettings`.
        given: the names of the model fields the user set; None takes those
            that differ from `TrainSettings`' defaults.

    Raises:
        ValueError: naming a given field that disagrees with the model.
    """
    if settings.init_from is None:
        return settings
    name, config = preset_architecture(settings.init_from)
    values = {key: config[key] for key in ("vocabulary_size", "hidden_dim", "num_layers", "num_heads", "head_dim")}
    values.update(architecture=name, sequence_length=config["max_sequence_length"], dropout=config["dropout"])
    values["position_mode"] = config["position_mode"] if "elita" in config["blocks"] else None
    if given is None:
        defaults = {field.name: field.default for field in dataclasses.fields(settings)}
        given = [key for key in MODEL_FIELDS if getattr(settings, key) != defaults[key]]
    for key in given:
        if getattr(settings, key) != values[key]:
            raise ValueError(
                f"--init-from {settings.init_from} is a model with {key}={values[key]!r}: fine-tuning keeps its "
                f"architecture. Leave --{key.replace('_', '-')} out. Received: {key}={getattr(settings, key)!r}"
            )
    return dataclasses.replace(settings, **values)


def preset_tokenizer(preset):
    """The serialized SentencePiece model of a finished run directory or keras-hub preset."""
    return ElitaCausalLM.from_preset(preset, load_weights=False).preprocessor.tokenizer.proto


def tokenizer_from_settings(settings, given=None):
    """`settings` with the vocabulary size of the tokenizer `settings.tokenizer_from` names.

    Args:
        settings: a `TrainSettings`.
        given: whether the user set `vocabulary_size`; None: whether it differs from the default.

    Raises:
        ValueError: when a given vocabulary size disagrees with the tokenizer's.
    """
    if settings.tokenizer_from is None:
        return settings
    tokenizer = ElitaCausalLM.from_preset(settings.tokenizer_from, load_weights=False).preprocessor.tokenizer
    size = tokenizer.vocabulary_size()
    if given is None:
        default = {field.name: field.default for field in dataclasses.fields(settings)}["vocabulary_size"]
        given = settings.vocabulary_size != default
    if given and settings.vocabulary_size != size:
        raise ValueError(
            f"--tokenizer-from {settings.tokenizer_from} has {size} pieces: the model's vocabulary is the tokenizer's. "
            f"Leave --vocabulary-size out. Received: vocabulary_size={settings.vocabulary_size}"
        )
    return dataclasses.replace(settings, vocabulary_size=size)


def resolve_position_mode(settings, run_path):
    """`settings` with `position_mode` decided, when it was left to the run (None).

    Resuming keeps the stored run's mode. A recipe that sets its own keeps it
    (`elita-reference`: `"length"`). Otherwise a new run trained in windows
    never sees a position past `sequence_length`, so it holds later ones at
    the last trained position (`clamped`): the reference's sinusoids, run on,
    leave what they were trained on past about 16x the training length
    (docs/long-context.md). A new `carry_state` run gets `fixed`: its
    positions run on through each article and are trained there. `run_path`
    is the directory whose `run.json` a resumed run has (the chief's
    `output_dir` for every worker). An architecture without ELiTA blocks keeps None.
    """
    if settings.position_mode is not None or "elita" not in architecture(settings.architecture)["blocks"]:
        return settings
    run = RunDirectory(run_path)
    stored = None if settings.force_new or not run.has_progress() else run.read_manifest()
    if stored is not None:
        mode = stored["model"]["position_mode"]
    else:
        mode = architecture(settings.architecture).get("position_mode")
        mode = mode or ("fixed" if settings.carry_state else "clamped")
    return dataclasses.replace(settings, position_mode=mode)


def check_carry_state(settings):
    """Raises `ValueError` unless the architecture can carry its state (`TrainSettings.carry_state`)."""
    config = model_config(settings)
    limit = decode_limit(config["blocks"], config["position_embedding"], config["max_sequence_length"])
    if limit is not None or config["position_mode"] == "length":
        raise ValueError(
            "--carry-state needs a model whose every block keeps a constant-size state, no learned positions and "
            f"positions that do not move with the length (elita). Received: architecture={settings.architecture!r} "
            f"(blocks {sorted(set(config['blocks']))}, position_embedding={config['position_embedding']}, "
            f"position_mode={config['position_mode']!r})"
        )


def requested_manifest(settings, config, data):
    """What makes this run this run: a resumed run must match it field by field."""
    fine_tuning = {}
    if settings.init_from is not None:
        weights = os.path.join(resolve_preset(settings.init_from), "model.weights.h5")
        with open(weights, "rb") as f:
            fine_tuning["init_from"] = {
                "preset": os.path.abspath(settings.init_from),
                "weights_sha256": hashlib.file_digest(f, "sha256").hexdigest(),
                "lora_rank": settings.lora_rank,
            }
    if settings.tokenizer_from is not None:
        fine_tuning["tokenizer_from"] = os.path.abspath(settings.tokenizer_from)
    return {
        **fine_tuning,
        "architecture": settings.architecture,
        "model": config,
        # WikiText's record is its name and hash; other text also records how it was split.
        "data": {key: data[key] for key in ("dataset", "sha256", "corpus") if key in data},
        "training": {
            "sequence_length": settings.sequence_length,
            "batch_size": settings.batch_size,
            "seed": settings.seed,
            "optimizer": settings.optimizer,
            "dtype_policy": settings.dtype_policy,
            "carry_state": settings.carry_state,
            "pack_documents": settings.pack_documents,
        },
    }


def load_settings_corpus(settings):
    """`load_corpus` of the text `settings` names: `(splits, data)`."""
    return load_corpus(
        settings.data,
        data_dir=settings.data_dir,
        tfds_dir=settings.tfds_dir,
        validation_data=settings.validation_data,
        test_data=settings.test_data,
        documents=settings.documents,
        text_field=settings.text_field,
        holdout_fraction=settings.holdout_fraction,
        seed=settings.seed,
        document_starts=True,
    )


def prepare_run(settings, run_dir, splits, data):
    """Checks the directory against the request, then the tokenizer and the windows of the three splits.

    A new run trains the tokenizer, cuts every split, and only then writes
    the tokenizer and `run.json`; a resumed one reuses its tokenizer after
    checking its hash. Returns `(config, windows)`.
    """
    config = model_config(settings)
    manifest = requested_manifest(settings, config, data)
    stored = run_dir.check_manifest(manifest)
    tokenizer_path = run_dir.file(TOKENIZER)
    # The splits hold (line, starts_document) pairs; the tokenizer trains on the lines.
    pairs, splits = splits, {split: pairs.map(lambda line, _: line) for split, pairs in splits.items()}
    reused = settings.init_from or settings.tokenizer_from  # fine-tuning keeps the model's own tokenizer
    if stored is None and reused is not None:
        proto = preset_tokenizer(reused)
    elif stored is None:
        text = sample_text(splits["train"], settings.tokenizer_sample_bytes, seed=settings.seed)
        proto = train_sentencepiece(text, vocabulary_size=settings.vocabulary_size, seed=settings.seed)
    else:
        proto = open(tokenizer_path, "rb").read() if os.path.exists(tokenizer_path) else b""
        if _sha256(proto) != stored["tokenizer_sha256"]:
            raise RunDirectoryError(
                f"{tokenizer_path} is missing or is not the tokenizer this run was trained with "
                f"(sha256 {stored['tokenizer_sha256'][:12]}...). Restore it, or use --force-new."
            )
    tokenizer = make_tokenizer(proto)
    windows = {}
    for split in pairs:
        # Each split tokenized once into files, reused by any later run on the same text and tokenizer.
        directory = os.path.join(cache_root(), fingerprint(data["sha256"], _sha256(proto), split))
        bar = keras.utils.Progbar(None, unit_name="token") if settings.verbose == 1 else None
        try:
            tokens = write_token_file(
                pairs[split], tokenizer, directory, settings.vocabulary_size, progress=bar.add if bar else None
            )
            cut = FileWindows(tokens, settings.sequence_length + 1)
            if not len(cut):
                raise ValueError(f"The corpus is shorter than one window of {settings.sequence_length + 1} tokens.")
            if split == "train" and settings.carry_state:  # the train split as one stream, with its document starts
                windows["train_stream"] = tokens.read(0, len(tokens))
                stream_steps_per_epoch(len(tokens), settings.batch_size, settings.sequence_length)
            elif len(cut) < settings.batch_size:  # checked before the run writes anything
                raise ValueError(
                    f"{len(cut)} windows of {settings.sequence_length + 1} tokens make no full batch of "
                    f"{settings.batch_size}: lower --batch-size or --sequence-length, or give it more text."
                )
        except ValueError as error:
            source = data.get("corpus", {}).get(f"{split}_data") or data["dataset"]  # the files given for it
            raise ValueError(f"The {split} split ({source}): {error}") from None
        # (windows, document starts): `lm_dataset`'s arguments.
        windows[split] = (cut, True if settings.pack_documents else None)
    if stored is None:
        write_atomically(tokenizer_path, proto)
        run_dir.write_manifest({**manifest, "tokenizer_sha256": _sha256(proto)})
    return config, windows


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


def train(settings, callbacks=(), strategy=None):
    """Trains (or resumes) one run as `settings` (a `TrainSettings`) says; returns the results dict.

    `callbacks` are added to Keras `fit`. `strategy` overrides
    `settings.strategy` with a `tf.distribute` strategy made by the caller
    (a `TPUStrategy`, say).

    With several workers (`TF_CONFIG`), every worker runs this with the same
    settings. The chief writes the run directory; the others write into
    scratch directories they delete, and read the chief's checkpoints from
    `output_dir` when they resume, so `output_dir` must be storage every
    worker sees. Each worker trains the same tokenizer from the same seed.

    Holds the run directory's lock throughout.

    Raises:
        RunDirectoryError: the directory holds another run, is in use, or cannot be written.
        CorruptCheckpointError: every checkpoint of the run is corrupt.
    """
    if strategy is None:
        strategy = make_strategy(settings.strategy)  # first: collectives are configured before any op runs
    settings = tokenizer_from_settings(init_from_settings(settings))
    if settings.lora_rank is not None:  # refused before anything is read or written
        ElitaBackbone.from_preset(settings.init_from, load_weights=False).check_lora_rank(settings.lora_rank)
    if strategy.extended.should_checkpoint:
        check_writable(settings.output_dir)  # before the data: minutes of preparation for nothing, otherwise
    corpus = load_settings_corpus(settings)  # before the run directory: bad text leaves nothing behind
    if strategy.extended.should_checkpoint:  # the chief, or the only process
        with RunDirectory(settings.output_dir, force_new=settings.force_new) as run_dir:
            return _train(settings, strategy, run_dir, run_dir.path, corpus, callbacks)
    with tempfile.TemporaryDirectory(prefix="elita-worker-") as scratch, RunDirectory(scratch) as run_dir:
        # A worker resumes from the chief's checkpoints, unless the chief is discarding them.
        checkpoints = scratch if settings.force_new else settings.output_dir
        return _train(settings, strategy, run_dir, checkpoints, corpus, callbacks)


def _train(settings, strategy, run_dir, checkpoints, corpus, callbacks):
    chief = strategy.extended.should_checkpoint
    settings = resolve_position_mode(settings, checkpoints)
    keras.utils.set_random_seed(settings.seed)
    if settings.carry_state:
        check_carry_state(settings)
    replicas = strategy.num_replicas_in_sync
    if settings.batch_size % replicas:
        raise ValueError(
            f"The global batch must split evenly over the {replicas} replicas. Received: "
            f"batch_size={settings.batch_size}"
        )
    splits, data = corpus
    config, windows = prepare_run(settings, run_dir, splits, data)
    if settings.carry_state:
        per_epoch = stream_steps_per_epoch(
            len(windows["train_stream"][0]), settings.batch_size, settings.sequence_length
        )
    else:
        per_epoch = steps_per_epoch(windows["train"][0], settings.batch_size)
    total = (
        settings.epochs * per_epoch
        if settings.max_steps is None
        else min(settings.max_steps, settings.epochs * per_epoch)
    )

    with strategy.scope():
        model, checkpoint = load_latest_checkpoint(checkpoints)
        if model is None:
            model = ElitaCausalLM(ElitaBackbone(**config, dtype=settings.dtype_policy))
            if settings.init_from is not None:
                start_from = ElitaBackbone.from_preset(settings.init_from)
                if start_from.lora_rank is not None:  # an adapted model starts from its merged weights
                    start_from = start_from.merge_lora()
                model.backbone.set_weights(start_from.get_weights())
            if settings.lora_rank is not None:
                model.backbone.enable_lora(settings.lora_rank)
            if settings.carry_state:
                model.enable_carried_state(settings.batch_size)
            model.compile(
                optimizer=elita_adam() if settings.optimizer == "adam" else three_lin_sgd(total),
                # Averaged over the weighted tokens: packed documents weigh each document's first token out.
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight"),
                weighted_metrics=None,  # the loss alone: fit takes it a chunk of tokens at a time
            )
    adapt_to_multi_worker(model, strategy, [settings.batch_size // replicas, settings.sequence_length])
    start = int(model.optimizer.iterations.numpy())
    if in_multi_worker_mode(strategy):
        # Paths may differ from machine to machine; everything else must match.
        local = {"output_dir", "data_dir", "tfds_dir", "verbose"}
        arguments = {k: v for k, v in dataclasses.asdict(settings).items() if k not in local}
        request = json.dumps([requested_manifest(settings, config, data), arguments], sort_keys=True).encode()
        with open(run_dir.file(TOKENIZER), "rb") as f:
            tokenizer = f.read()
        fingerprint = lambda blob: int(_sha256(blob)[:15], 16)  # noqa: E731  (fits in an int64)
        check_workers_agree(
            strategy, {"arguments": fingerprint(request), "tokenizer": fingerprint(tokenizer), "start step": start}
        )
    if start and chief:
        print(f"Resuming {settings.architecture} from step {start} ({checkpoint})", flush=True)

    def evaluation(split):
        def shard(index, count):
            cut, starts = windows[split]
            data = lm_dataset(
                cut, settings.batch_size, shuffle=False, shard=index, num_shards=count, document_starts=starts
            )
            return data.take(settings.eval_batches) if settings.eval_batches else data

        return distributed_dataset(strategy, shard, settings.batch_size)

    step_log = StepLog(run_dir.file("steps.csv"), time.perf_counter(), start)
    fit_callbacks = [
        step_log,
        # Every worker saves (a save may read variables collectively); only the chief's go to the run.
        Checkpoint(run_dir.path, settings.checkpoint_every, settings.keep_checkpoints),
        keras.callbacks.TensorBoard(run_dir.file("tensorboard"), update_freq=settings.checkpoint_every),
        *callbacks,
    ]
    step = start
    while step < total:
        epoch = step // per_epoch
        # A resumed epoch first runs its remaining steps, then epochs are whole again.
        steps = min(per_epoch - step % per_epoch, total - step)
        if settings.carry_state:  # one process (checked): the batch's rows are the streams
            ids, resets = windows["train_stream"]
            stream = lambda shard, num_shards: stream_dataset(  # noqa: E731
                ids, resets, settings.batch_size, settings.sequence_length, epochs=None, start_step=step
            )
        else:
            cut, starts = windows["train"]
            stream = functools.partial(
                lm_dataset,
                cut,
                settings.batch_size,
                seed=settings.seed,
                epochs=None,
                start_step=step,
                document_starts=starts,
            )
        model.fit(
            distributed_dataset(
                strategy, lambda index, count: stream(shard=index, num_shards=count), settings.batch_size
            ),
            initial_epoch=epoch,
            epochs=epoch + 1,
            steps_per_epoch=steps,
            validation_data=evaluation("validation"),
            callbacks=fit_callbacks,
            shuffle=False,  # the stream is shuffled by its seed
            verbose=settings.verbose,
        )
        step += steps

    results = {
        "architecture": settings.architecture,
        "seed": settings.seed,
        "steps": total,
        "params": model.backbone.count_params(),
        "trainable_params": sum(int(np.prod(w.shape)) for w in model.backbone.trainable_weights),
        "params_without_embeddings": model.backbone.count_params_without_embeddings(),
        "replicas": replicas,
        "data": data,
        "config": {"model": config, "settings": dataclasses.asdict(settings)},
        "software": software_versions(),
    }
    for split in ["validation", "test"]:
        loss = float(model.evaluate(evaluation(split), verbose=0))
        results[f"{split}_loss"] = loss
        results[f"{split}_perplexity"] = math.exp(loss)
    if step_log.step_times:
        results["step_time_s"] = sum(step_log.step_times) / len(step_log.step_times)
        results["tokens_per_s"] = settings.batch_size * settings.sequence_length / results["step_time_s"]
    results["peak_memory_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # A figure taken while other work shared the cores says so here.
    load = step_log.load or [os.getloadavg()[0]]
    results["load_average"] = {"mean": sum(load) / len(load), "max": max(load), "cpus": os.cpu_count()}
    write_atomically(run_dir.file("results.json"), json.dumps(results, indent=2))
    if chief:
        # The trained model as a keras-hub preset, in the run's `preset/` folder.
        save_run_preset(ElitaCausalLM(model.backbone.merge_lora()) if settings.merge_lora else model, run_dir.path)
        print(json.dumps(results, indent=2), flush=True)
    return results
