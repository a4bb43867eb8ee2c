"""Training as a library: settings, the loop, run directories (their files, manifest, lock, preset) and checkpoints.

Each name loads its module on first use (`elita_tf.lazy`).
"""

from elita_tf.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "CorruptCheckpointError": "checkpoints",
        "latest_checkpoint": "checkpoints",
        "load_latest_checkpoint": "checkpoints",
        "save_checkpoint": "checkpoints",
        "verify_checkpoint": "checkpoints",
        "DistributedSetupError": "distributed",
        "make_strategy": "distributed",
        "StepLog": "callbacks",
        "evaluate": "evaluation",
        "EvaluateSettings": "evaluate_settings",
        "train": "loop",
        "RunDirectory": "run_directory",
        "list_checkpoints": "run_files",
        "preset_of": "run_files",
        "RunDirectoryError": "run_directory",
        "write_atomically": "run_directory",
        "TrainSettings": "settings",
    },
)
