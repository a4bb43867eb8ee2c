"""elita-tf: efficient, linear-time transformer building blocks for Keras 3 on TensorFlow."""

from elita_tf import layers, models, ops, optimizers, schedules

__version__ = "0.1.0"
