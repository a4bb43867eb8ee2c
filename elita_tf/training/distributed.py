"""Training across devices and machines: the strategy, each worker's rows of a batch, Keras 3 workarounds.

On TensorFlow, `train` makes the `tf.distribute` strategy first (`make_strategy`),
feeds every replica its rows of the same deterministic global batches
(`distributed_dataset`), checks that all workers train the same run from the
same step (`check_workers_agree`) and, across several processes, patches the
two places where Keras 3's `fit` fails under `MultiWorkerMirroredStrategy`
(`adapt_to_multi_worker`).

On JAX, `join_processes` starts a run of several processes
(`keras.distribution.initialize`, from Keras' `KERAS_DISTRIBUTION_*` environment
variables) before anything else, and `make_distribution` makes the
`keras.distribution` the model is built and trained under: `DataParallel` over
every device, or `ModelParallel` on a mesh of `(devices / K, K)` with
`ElitaBackbone.get_layout_map`. Each process reads its rows of every global batch
(`distributed_dataset`) and Keras assembles them on the devices. Process 0 is the
chief (`is_chief`), as TensorFlow's chief worker.
"""

import os

import keras
import numpy as np
import tensorflow as tf

from elita_tf.models import ElitaBackbone


class DistributedSetupError(RuntimeError):
    """A multi-worker run that cannot start: the strategy came too late, or the workers disagree."""


def make_strategy(name):
    """The `tf.distribute` strategy for `TrainSettings.strategy`.

    `"multiworker"` reads the cluster from `TF_CONFIG` and must be made before
    TensorFlow runs its first op, because its collectives are configured at
    start-up; `train` makes it first thing.
    """
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multiworker":
        try:
            return tf.distribute.MultiWorkerMirroredStrategy()
        except RuntimeError as error:
            raise DistributedSetupError(
                "The multiworker strategy must be made before TensorFlow runs any op (its collectives are "
                "configured at start-up). Call `elita_tf.training.train` before anything else touches "
                "TensorFlow, or make the strategy at program start and pass it: train(settings, strategy=...). "
                f"TensorFlow said: {error}"
            ) from None
    return tf.distribute.get_strategy()


# Keras' variables of a run of several JAX processes (`keras.distribution.initialize`).
PROCESS_VARIABLES = (
    "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "KERAS_DISTRIBUTION_PROCESS_ID",
)


def join_processes(settings):
    """On JAX, joins a run of several processes when Keras' variables name one (`PROCESS_VARIABLES`), before any op
    runs; returns whether it did. Elsewhere they are refused: TensorFlow's workers read `TF_CONFIG`."""
    given = [name for name in PROCESS_VARIABLES if name in os.environ]
    if not given:
        return False
    if keras.config.backend() != "jax" or not _distributed(settings):
        raise ValueError(
            f"{', '.join(given)} join a run of several JAX processes: it needs KERAS_BACKEND=jax and "
            f"--strategy data-parallel or --model-parallel. Received: backend={keras.config.backend()!r}, "
            f"strategy={settings.strategy!r}"
        )
    keras.distribution.initialize()
    return True


def process_index():
    """This process's index in a run of several JAX processes; 0 in a run of one."""
    if keras.config.backend() != "jax":
        return 0
    import jax

    return jax.process_index()


def process_count():
    """The processes of a run of several JAX processes; 1 otherwise (TensorFlow's workers count as their strategy's)."""
    if keras.config.backend() != "jax":
        return 1
    import jax

    return jax.process_count()


def wait_for_every_process(name):
    """In a run of several JAX processes, returns once every process has called this with `name`.

    A process that is done waits for the chief's last writes: JAX's shutdown ends every
    process that reaches it long before the others."""
    if process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def several_workers(strategy):
    """Whether this run spans several processes: TensorFlow's workers (`TF_CONFIG`) or JAX's."""
    return in_multi_worker_mode(strategy) or process_count() > 1


def _distributed(settings):
    """Whether `settings` ask for a `keras.distribution` (`make_distribution`)."""
    return settings.strategy == "data-parallel" or settings.model_parallel is not None


def is_chief(strategy):
    """Whether this process writes the run directory: TensorFlow's chief worker, JAX's process 0, or the only one."""
    return strategy.extended.should_checkpoint and process_index() == 0


def make_distribution(settings, config):
    """The `keras.distribution` of a run's `settings` (JAX's: `strategy="data-parallel"`, `model_parallel`), or None.

    `config` is the run's backbone config, whose sizes the model axis must divide. A device count that
    the model axis, or a global batch that the data axis, does not divide is refused in one line.
    """
    if not _distributed(settings):
        return None
    devices = keras.distribution.list_devices()
    model = settings.model_parallel or 1
    if len(devices) % model:
        raise ValueError(
            f"The model axis must divide the {len(devices)} devices ({', '.join(devices)}). Received: "
            f"model_parallel={model}"
        )
    data = len(devices) // model
    if settings.batch_size % data:
        raise ValueError(
            f"The global batch must split evenly over the {data} devices of the data axis. Received: "
            f"batch_size={settings.batch_size}"
        )
    local = len(devices) // process_count()
    if local % model:
        raise ValueError(
            f"The model axis must divide the {local} devices of each process: a model replica lives in one. "
            f"Received: model_parallel={model}"
        )
    # Each process reads its own rows of every batch (`distributed_dataset`): Keras need not cut the stream.
    if model == 1:
        return keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
    mesh = keras.distribution.DeviceMesh((data, model), ("batch", "model"), devices)
    layout_map = ElitaBackbone.get_layout_map(mesh, config=config)
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch", auto_shard_dataset=False)


def replicas_and_devices(strategy):
    """`(replicas, devices)` of a run: the model replicas that split each batch, and the devices they hold."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        return strategy.num_replicas_in_sync, strategy.num_replicas_in_sync
    return distribution.num_model_replicas, len(distribution.device_mesh.devices.flatten())


def distributed_dataset(strategy, make_dataset, batch_size):
    """`make_dataset(shard, num_shards)`, a stream of global batches of `batch_size`, fed to `strategy`'s replicas.

    Each input pipeline (one per worker) builds the same deterministic stream
    of global batches and keeps only its own rows, so the replicas of a step
    together see exactly the single-process batch of that step.
    """
    if strategy is tf.distribute.get_strategy():  # no strategy: one process (or, on JAX, each process its rows)
        return make_dataset(process_index(), process_count())

    def pipeline(context):
        data = make_dataset(context.input_pipeline_id, context.num_input_pipelines)
        local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
        if local_replicas > 1:  # this worker's rows, cut again for its replicas in turn
            data = data.unbatch().batch(context.get_per_replica_batch_size(batch_size), drop_remainder=True)
        return data

    return strategy.distribute_datasets_from_function(pipeline)


def in_multi_worker_mode(strategy):
    """Whether `strategy` spans more than one process (a `TF_CONFIG` cluster of several tasks)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return False
    jobs = resolver.cluster_spec().as_dict()
    return len(jobs.get("chief", [])) + len(jobs.get("worker", [])) > 1


def adapt_to_multi_worker(model, strategy, batch_shape):
    """Works around two gaps in Keras 3's `fit`/`evaluate` across several workers (keras-team/keras#20585).

    1. Before the first step Keras averages one `(inputs, targets)` batch
       over the replicas to learn its shapes, and the multi-worker strategy
       cannot reduce a tuple. The shapes are known (`batch_shape`, one
       replica's), so the loss, metrics and optimizer are built from them
       here and that step is skipped.
    2. After each step Keras averages the logs over the replicas along axis 0,
       which scalars do not have. Each replica hands its logs over as
       1-element vectors, and their average along axis 0 is the scalar
       average over replicas (the replicas' batches are of equal size).

    Nothing changes for a strategy within one process.
    """
    if not in_multi_worker_mode(strategy):
        return
    tokens = tf.zeros(batch_shape, tf.int32)
    with strategy.scope():
        model._symbolic_build(data_batch=({"token_ids": tokens, "padding_mask": tf.ones_like(tokens)}, tokens))
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None

    def as_vectors(step):
        return lambda data: {name: tf.reshape(value, [1]) for name, value in step(data).items()}

    model.train_step = as_vectors(model.train_step)
    model.test_step = as_vectors(model.test_step)


def check_workers_agree(strategy, facts):
    """Raises on every worker unless all workers hold the same `facts` (a dict of name to int).

    Workers launched with different arguments, or that resume from different
    checkpoints, would otherwise train different runs in lockstep and
    average their gradients without a word.
    """
    names = sorted(facts)
    local = np.array([facts[name] for name in names], np.int64)
    if process_count() > 1:  # JAX's processes
        from jax.experimental import multihost_utils

        gathered = np.asarray(multihost_utils.process_allgather(local))
    else:
        gathered = strategy.gather(strategy.run(lambda: tf.identity(tf.constant(local))), axis=0).numpy()
    table = gathered.reshape([-1, len(names)])
    differing = [name for i, name in enumerate(names) if len(set(table[:, i].tolist())) > 1]
    if differing:
        raise DistributedSetupError(
            "The workers disagree on "
            + ", ".join(f"{name} (each replica's: {table[:, names.index(name)].tolist()})" for name in differing)
            + ". Launch every worker with the same arguments, and keep --output-dir on storage every worker "
            "reads: resuming workers load the chief's checkpoints from it."
        )
