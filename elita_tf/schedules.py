"""The learning-rate schedules and optimizers of the training runs: ELiTA's Adam, 3Lin's normalised SGD."""

import keras
from keras import ops

from elita_tf.optimizers import NormalizedSGD


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
        step = ops.cast(step, "float32") + 1.0
        return ops.minimum(self.peak, self.scale * ops.rsqrt(step))

    def get_config(self):
        return {"peak": self.peak, "scale": self.scale}


@keras.saving.register_keras_serializable(package="elita_tf")
class TailSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`lr(t) = rate * min(1, tail * (1 - t / total_steps))`: constant, then linear to 0 over the last `1 / tail`.

    3Lin's `tailN` schedule for its normalised SGD.

    Args:
        rate: float. The constant rate. Defaults to `0.1`.
        total_steps: int. Steps of the whole run.
        tail: float >= 1. The decay takes the last `1 / tail` of the run. Defaults to `10`.

    Example:
    >>> schedule = TailSchedule(0.1, total_steps=100, tail=10)
    >>> [round(float(schedule(t)), 3) for t in (0, 89, 95)]
    [0.1, 0.1, 0.05]
    """

    def __init__(self, rate=0.1, total_steps=1, tail=10.0):
        if not rate > 0 or isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(
                f"`rate` must be positive and `total_steps` a positive integer. Received: rate={rate!r}, "
                f"total_steps={total_steps!r}"
            )
        if not tail >= 1:
            raise ValueError(f"`tail` must be >= 1. Received: tail={tail!r}")
        self.rate, self.total_steps, self.tail = float(rate), total_steps, float(tail)

    def __call__(self, step):
        progress = ops.cast(step, "float32") / self.total_steps
        return self.rate * ops.clip(self.tail * (1.0 - progress), 0.0, 1.0)

    def get_config(self):
        return {"rate": self.rate, "total_steps": self.total_steps, "tail": self.tail}


def elita_adam(peak=1e-3, scale=1e-2):
    """Adam as the ELiTA runs: the schedule above, beta1 0.9, beta2 0.99."""
    return keras.optimizers.Adam(learning_rate=InverseSqrtSchedule(peak, scale), beta_1=0.9, beta_2=0.99)


def three_lin_schedule(total_steps, rate=0.1, tail=10.0):
    """3Lin's learning rate over a run of `total_steps`: `TailSchedule(rate, total_steps, tail)`."""
    return TailSchedule(rate, total_steps, tail)


def three_lin_sgd(total_steps, rate=0.1, tail=10.0):
    """3Lin's optimizer: `NormalizedSGD` at `rate` with the `TailSchedule`.

    Every matrix moves by `rate` in Frobenius norm per step; the token
    embedding (and learned positions) move row by row, and the output
    layer's kernel column by column (one per token), scaled by their running
    gradient norms, as 3Lin's embedding and final layer.
    """
    return NormalizedSGD(
        three_lin_schedule(total_steps, rate, tail), row_normalized={"embedding/embeddings": 0, "logits/kernel": -1}
    )
