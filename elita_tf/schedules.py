"""The ELiTA learning-rate schedule and optimizer settings."""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="elita_tf")
class InverseSqrtSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`lr(step) = min(peak, scale / sqrt(step))`, steps counted from 1.

    With the defaults, 1e-3 for the first 100 steps, then inverse-square-root
    decay: ELiTA's `min(1e-3, 1e-2 / sqrt(step))`.

    Args:
        peak: float. The largest learning rate. Defaults to `1e-3`.
        scale: float. Defaults to `1e-2`.

    Example:
    >>> schedule = InverseSqrtSchedule()
    >>> float(schedule(0)), round(float(schedule(399)), 6)
    (0.001, 0.0005)
    """

    def __init__(self, peak=1e-3, scale=1e-2):
        if not peak > 0 or not scale > 0:
            raise ValueError(f"`peak` and `scale` must be positive. Received: peak={peak!r}, scale={scale!r}")
        self.peak = float(peak)
        self.scale = float(scale)

    def __call__(self, step):
        # Keras passes the number of updates done so far: the first update is step 1.
        step = tf.cast(step, tf.float32) + 1.0
        return tf.minimum(self.peak, self.scale * tf.math.rsqrt(step))

    def get_config(self):
        return {"peak": self.peak, "scale": self.scale}


def elita_adam(peak=1e-3, scale=1e-2):
    """Adam as the ELiTA runs: the schedule above, beta1 0.9, beta2 0.99."""
    return keras.optimizers.Adam(learning_rate=InverseSqrtSchedule(peak, scale), beta_1=0.9, beta_2=0.99)
