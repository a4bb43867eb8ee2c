"""Training across devices and machines: the strategy, each worker's rows of a batch, Keras 3 workarounds.

`train` makes the strategy first (`make_strategy`), feeds every replica its
rows of the same deterministic global batches (`distributed_dataset`),
checks that all workers train the same run from the same step
(`check_workers_agree`) and, across several processes, patches the two
places where Keras 3's `fit` fails under `MultiWorkerMirroredStrategy`
(`adapt_to_multi_worker`).
"""

import tensorflow as tf


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


def distributed_dataset(strategy, make_dataset, batch_size):
    """`make_dataset(shard, num_shards)`, a stream of global batches of `batch_size`, fed to `strategy`'s replicas.

    Each input pipeline (one per worker) builds the same deterministic stream
    of global batches and keeps only its own rows, so the replicas of a step
    together see exactly the single-process batch of that step.
    """
    if strategy is tf.distribute.get_strategy():  # no strategy: one process, one replica
        return make_dataset(0, 1)

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
    local = tf.constant([facts[name] for name in names], tf.int64)
    gathered = strategy.gather(strategy.run(lambda: tf.identity(local)), axis=0)
    table = tf.reshape(gathered, [-1, len(names)]).numpy()
    differing = [name for i, name in enumerate(names) if len(set(table[:, i].tolist())) > 1]
    if differing:
        raise DistributedSetupError(
            "The workers disagree on "
            + ", ".join(f"{name} (by replica: {table[:, names.index(name)].tolist()})" for name in differing)
            + ". Launch every worker with the same arguments, and keep --output-dir on storage every worker "
            "reads: resuming workers load the chief's checkpoints from it."
        )
