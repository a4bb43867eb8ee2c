"""The training loop: an `ElitaCausalLM` of a named architecture, fitted on a corpus, resumable exactly.

    from elita_tf.training import TrainSettings, train
    results = train(TrainSettings("runs/elita", architecture="elita", epochs=2))
    results = train(TrainSettings("runs/mine", corpus=CorpusSettings("my-texts/*.txt")))

The corpus is WikiText-2 unless `corpus` names another (`elita_tf.data.load_corpus`). WikiText is
downloaded (and prepared once by tensorflow-datasets) unless `corpus.data_dir` or the environment
variable `ELITA_WIKITEXT_DIR` names a local directory holding its files. The text is read and
checked before the run directory is touched: bad input leaves nothing behind.

A run directory (`elita_tf.training.run_directory`; `run_files` lists its files) keeps the training state
(manifest, tokenizer, step log, checkpoints every `checkpoint_every` steps and at each epoch end,
results) apart from the model it publishes: a keras-hub preset, written at the end
(`ElitaCausalLM.from_preset(preset_of(run_dir))` loads it; `keras_hub.upload_preset` publishes it).

Training again into the same directory resumes exactly where the last intact checkpoint left
off: same step, same data position, same result as an uninterrupted run. A larger `max_steps`
extends a run (3Lin's schedule then decays to the new end); a finished run asked again says so
and keeps its results; fewer steps than it trained are refused. A directory holding another run
(other settings, data or tokenizer), or one another process is writing, is refused before
anything in it changes, unless that run saved nothing yet: then it starts over, with a notice.
`elita-train` (`elita_tf.cli.train`) is the command line.
"""

import contextlib
import dataclasses
import functools
import json
import math
import os
import resource
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

from elita_tf.data import steps_per_epoch, stream_dataset, stream_steps_per_epoch
from elita_tf.models import ElitaBackbone, ElitaCausalLM
from elita_tf.schedules import elita_adam, three_lin_schedule, three_lin_sgd
from elita_tf.training.callbacks import Checkpoint, EpochProgress, StepLog
from elita_tf.training.checkpoints import load_latest_checkpoint
from elita_tf.training.distributed import (
    adapt_to_multi_worker,
    check_workers_agree,
    distributed_dataset,
    is_chief,
    join_processes,
    make_distribution,
    make_strategy,
    replicas_and_devices,
    several_workers,
    wait_for_every_process,
)
from elita_tf.training.manifest import requested_manifest
from elita_tf.training.model_settings import check_carry_state, complete_settings, model_config, resolve_position_mode
from elita_tf.training.provenance import software_versions
from elita_tf.training.run_data import load_settings_corpus, prepare_run, sha256
from elita_tf.training.run_directory import (
    RunDirectory,
    RunDirectoryError,
    check_sources_outside,
    check_writable,
    read_results,
    results_json,
    write_atomically,
)
from elita_tf.training.run_files import PRESET_DIR, RESULTS_FILE, STEPS_FILE, TENSORBOARD_DIR, preset_of
from elita_tf.training.settings import fields_marked


def train(settings, callbacks=(), strategy=None):
    """Trains (or resumes) one run as `settings` (a `TrainSettings`) says; returns the results dict.

    `callbacks` are added to Keras `fit`. `strategy` overrides
    `settings.strategy` with a `tf.distribute` strategy made by the caller
    (a `TPUStrategy`, say).

    With several workers (TensorFlow's `TF_CONFIG`, or JAX's processes joined by
    `keras.distribution.initialize`), every worker runs this with the same
    settings. The chief (JAX's process 0) writes the run directory; the others write into
    scratch directories they delete, and read the chief's checkpoints from
    `output_dir` when they resume, so `output_dir` must be storage every
    worker sees. Each worker trains the same tokenizer from the same seed.

    Holds the run directory's lock throughout.

    Raises:
        RunDirectoryError: the directory holds another run, is in use, cannot be written, or holds the
            model or tokenizer the run starts from.
        CorruptCheckpointError: every checkpoint of the run is corrupt.
    """
    if strategy is None:
        strategy = make_strategy(settings.strategy)  # first: collectives are configured before any op runs
    join_processes(settings)  # JAX's, as early
    check_sources_outside(settings)
    settings = complete_settings(settings)
    distribution = make_distribution(settings, model_config(settings))
    with contextlib.nullcontext() if distribution is None else distribution.scope():
        results = _train_in_directory(settings, strategy, callbacks)
    wait_for_every_process("elita-train: the run is written")
    return results


def _train_in_directory(settings, strategy, callbacks):
    if settings.lora_rank is not None:  # refused before anything is read or written
        ElitaBackbone.from_preset(preset_of(settings.init_from), load_weights=False).check_lora_rank(settings.lora_rank)
    if is_chief(strategy):
        check_writable(settings.output_dir)  # before the data: minutes of preparation for nothing, otherwise
    corpus = load_settings_corpus(settings)  # before the run directory: bad text leaves nothing behind
    if is_chief(strategy):  # the chief, or the only process
        with RunDirectory(settings.output_dir, force_new=settings.force_new) as run_dir:
            return _train(settings, strategy, run_dir, run_dir.path, corpus, callbacks)
    with tempfile.TemporaryDirectory(prefix="elita-worker-") as scratch, RunDirectory(scratch) as run_dir:
        # A worker resumes from the chief's checkpoints, unless the chief is discarding them.
        checkpoints = scratch if settings.force_new else settings.output_dir
        return _train(settings, strategy, run_dir, checkpoints, corpus, callbacks)


def _train(settings, strategy, run_dir, checkpoints, corpus, callbacks):
    chief = is_chief(strategy)
    settings = resolve_position_mode(settings, checkpoints)
    keras.utils.set_random_seed(settings.seed)
    if settings.carry_state:
        check_carry_state(settings)
    replicas, devices = replicas_and_devices(strategy)
    if settings.batch_size % replicas:
        raise ValueError(
            f"The global batch must split evenly over the {replicas} replicas. Received: "
            f"batch_size={settings.batch_size}"
        )
    splits, data = corpus
    prepared = prepare_run(settings, run_dir, splits, data)
    if settings.carry_state:
        train_tokens = len(prepared.splits["train"].tokens)
        per_epoch = stream_steps_per_epoch(train_tokens, settings.batch_size, settings.sequence_length)
    else:
        per_epoch = steps_per_epoch(prepared.splits["train"].examples, settings.batch_size)
    total = (
        settings.epochs * per_epoch
        if settings.max_steps is None
        else min(settings.max_steps, settings.epochs * per_epoch)
    )

    with strategy.scope():
        model, checkpoint = load_latest_checkpoint(checkpoints)
        if model is None:
            model = ElitaCausalLM(ElitaBackbone(**prepared.config, dtype=settings.dtype_policy))
            if settings.init_from is not None:
                start_from = ElitaBackbone.from_preset(preset_of(settings.init_from))
                if start_from.lora_rank is not None:  # an adapted model starts from its merged weights
                    start_from = start_from.merge_lora()
                model.backbone.set_weights(start_from.get_weights())
            if settings.lora_rank is not None:
                model.backbone.enable_lora(settings.lora_rank)
            if settings.carry_state:
                model.enable_carried_state(settings.batch_size)
            model.compile(
                optimizer=elita_adam() if settings.optimizer == "adam" else three_lin_sgd(total),
                weighted_metrics=None,  # the loss alone: fit takes it a chunk of tokens at a time
            )
        elif settings.optimizer == "normalized-sgd":
            # The checkpoint's schedule ends where its run ended: a run extended (a larger --max-steps)
            # decays to its new end instead of training its new steps at 0.
            model.optimizer.learning_rate = three_lin_schedule(total)
    adapt_to_multi_worker(model, strategy, [settings.batch_size // replicas, settings.sequence_length])
    start = int(model.optimizer.iterations.numpy())
    if start > total:  # its checkpoints, preset and results are the longer run's
        raise RunDirectoryError(
            f"The run in {settings.output_dir!r} has trained {start} steps already, more than the {total} that "
            f"--max-steps and --epochs allow now. Allow {start} or more to go on with it, or use --force-new to "
            f"train {total} steps anew. Received: max_steps={settings.max_steps}, epochs={settings.epochs}"
        )
    if several_workers(strategy):
        # Paths may differ from machine to machine; everything else must match.
        local = fields_marked("local")
        arguments = {k: v for k, v in dataclasses.asdict(settings).items() if k not in local}
        arguments["corpus"] = settings.corpus.record()
        request = json.dumps([requested_manifest(settings, prepared.config, data), arguments], sort_keys=True).encode()
        tokenizer = prepared.preprocessor.tokenizer.proto
        fingerprint = lambda blob: int(sha256(blob)[:15], 16)  # noqa: E731  (fits in an int64)
        check_workers_agree(
            strategy, {"arguments": fingerprint(request), "tokenizer": fingerprint(tokenizer), "start step": start}
        )
    if 0 < start < total and chief:
        print(f"Resuming {settings.architecture} from step {start} ({checkpoint})", flush=True)

    def evaluation(split):
        """`(dataset, batches)` of a held-out split: the count told to Keras, which warns when a stream ends."""
        held_out = prepared.splits[split]
        batches = min(steps_per_epoch(held_out.examples, settings.batch_size), settings.eval_batches or math.inf)

        def shard(index, count):
            return held_out.dataset(settings.batch_size, shuffle=False, shard=index, num_shards=count).take(batches)

        return distributed_dataset(strategy, shard, settings.batch_size), batches

    stored = read_results(checkpoints)
    finished = stored if start == total and _evaluated_as(stored, total, settings) else None
    if finished is not None:
        if chief:
            print(f"{settings.output_dir} has finished its {total} steps already: nothing to train or evaluate.")
        if not os.path.exists(os.path.join(checkpoints, PRESET_DIR)):  # the chief's: every worker decides alike
            _save_preset(model, prepared.preprocessor, settings, run_dir)
        if chief:
            _print_results(settings, run_dir)
        return finished
    if start == total and chief:
        print(f"{settings.output_dir} has finished its {total} steps: evaluating it again.", flush=True)

    step_log = StepLog(run_dir.file(STEPS_FILE), time.perf_counter(), start)
    fit_callbacks = [
        step_log,
        # Every worker saves (a save may read variables collectively); only the chief's go to the run.
        Checkpoint(run_dir.path, settings.checkpoint_every, settings.keep_checkpoints),
        keras.callbacks.TensorBoard(run_dir.file(TENSORBOARD_DIR), update_freq=settings.checkpoint_every),
        *callbacks,
    ]
    if settings.verbose:
        fit_callbacks.append(EpochProgress(math.ceil(total / per_epoch)))
    validation, validation_steps = evaluation("validation")
    # The validation loss at the last step, from `fit`'s own pass over the same batches: the
    # results need not evaluate the split again (seconds of a short run).
    last_validation = None
    step = start
    train_stream = prepared.splits["train"].tokens.stream() if settings.carry_state else None
    while step < total:
        epoch = step // per_epoch
        # A resumed epoch first runs its remaining steps, then epochs are whole again.
        steps = min(per_epoch - step % per_epoch, total - step)
        if settings.carry_state:  # one process (checked): the batch's rows are the streams
            ids, document_starts = train_stream
            stream = lambda shard, num_shards: stream_dataset(  # noqa: E731
                ids, document_starts, settings.batch_size, settings.sequence_length, epochs=None, start_step=step
            )
        else:
            stream = functools.partial(
                prepared.splits["train"].dataset, settings.batch_size, seed=settings.seed, epochs=None, start_step=step
            )
        history = model.fit(
            distributed_dataset(
                strategy, lambda index, count: stream(shard=index, num_shards=count), settings.batch_size
            ),
            initial_epoch=epoch,
            epochs=epoch + 1,
            steps_per_epoch=steps,
            validation_data=validation,
            validation_steps=validation_steps,
            callbacks=fit_callbacks,
            shuffle=False,  # the stream is shuffled by its seed
            verbose=settings.verbose,
        )
        last_validation = history.history["val_loss"][-1]
        step += steps

    results = {
        "architecture": settings.architecture,
        "seed": settings.seed,
        "steps": total,
        "params": model.backbone.count_params(),
        "trainable_params": sum(int(np.prod(w.shape)) for w in model.backbone.trainable_weights),
        "params_without_embeddings": model.backbone.count_params_without_embeddings(),
        "replicas": replicas,
        "devices": devices,
        "data": data,
        "config": {"model": prepared.config, "settings": dataclasses.asdict(settings)},
        "software": software_versions(),
    }
    for split in ["validation", "test"]:
        if split == "validation" and last_validation is not None:
            loss = float(last_validation)
        else:
            data, batches = evaluation(split)
            loss = float(model.evaluate(data, steps=batches, verbose=0))
        results[f"{split}_loss"] = loss
        results[f"{split}_perplexity"] = math.exp(loss)
    if step_log.step_times:
        results["step_time_s"] = sum(step_log.step_times) / len(step_log.step_times)
        results["tokens_per_s"] = settings.batch_size * settings.sequence_length / results["step_time_s"]
    elif stored:  # no step timed here (evaluated again, or one step resumed): the run's earlier figure stands
        results.update({key: stored[key] for key in ("step_time_s", "tokens_per_s") if key in stored})
    results["peak_memory_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    gpu_peak = accelerator_peak_mib(keras.backend.backend())
    if gpu_peak is not None:  # the accelerator's own peak, beside the host's
        results["peak_gpu_memory_mib"] = gpu_peak
    # A figure taken while other work shared the cores says so here.
    load = step_log.load or [os.getloadavg()[0]]
    results["load_average"] = {"mean": sum(load) / len(load), "max": max(load), "cpus": os.cpu_count()}
    write_atomically(run_dir.file(RESULTS_FILE), results_json(results))
    # Every worker saves (a save may read variables collectively); only the chief's goes to the run.
    _save_preset(model, prepared.preprocessor, settings, run_dir)
    if chief:
        _print_results(settings, run_dir)
    return results


def accelerator_peak_mib(backend):
    """The most memory Keras' `backend` held on its accelerator so far, in MiB; None on a CPU.

    Each backend's own allocator: JAX's first device, PyTorch's CUDA
    allocator, TensorFlow's GPU:0. On JAX or PyTorch, TensorFlow's GPU holds
    the data pipeline's tensors only, not the model's. A TensorFlow run
    imports neither JAX nor PyTorch.
    """
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        peak = None if device.platform == "cpu" else (device.memory_stats() or {}).get("peak_bytes_in_use")
    elif backend == "torch":
        import torch

        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    else:
        on_gpu = tf.config.list_logical_devices("GPU")
        peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] if on_gpu else None
    return None if peak is None else peak / 2**20


def _evaluated_as(results, total, settings):
    """Whether `results` are those of `total` steps, evaluated and published as `settings` ask."""
    if results is None:
        return False
    recorded = results.get("config", {}).get("settings", {})
    same = all(recorded.get(key) == getattr(settings, key) for key in ("eval_batches", "merge_lora"))
    return same and results.get("steps") == total


def _save_preset(model, preprocessor, settings, run_dir):
    """The trained model, with the run's preprocessor (its tokenizer wrote the token files), as its keras-hub
    preset. The model trains without it: keras-hub's `fit` would tokenize again what the token files hold."""
    backbone = model.backbone.merge_lora() if settings.merge_lora else model.backbone
    ElitaCausalLM(backbone, preprocessor).save_to_preset(run_dir.file(PRESET_DIR))


def _print_results(settings, run_dir):
    from elita_tf.training.plot import results_table  # matplotlib, once a run ends

    print(results_table({settings.architecture: run_dir.path}), end="", flush=True)
    print(f"Everything the run measured: {run_dir.file(RESULTS_FILE)}", flush=True)
