"""Training as a library: settings, the loop, run directories (manifest, lock) and checkpoints."""

from elita_tf.training.checkpoints import (
    CorruptCheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_latest_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from elita_tf.training.distributed import DistributedSetupError, make_strategy
from elita_tf.training.loop import StepLog, train
from elita_tf.training.run_directory import (
    RunDirectory,
    RunDirectoryError,
    write_atomically,
)
from elita_tf.training.settings import TrainSettings
