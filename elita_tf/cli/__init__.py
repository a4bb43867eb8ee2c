"""The command lines: `elita-train`, `elita-compare`, `elita-export`, thin wrappers over the library."""

from elita_tf.cli.quiet import quiet_start_up

# Before any command imports TensorFlow, which reads its log level once.
quiet_start_up()
