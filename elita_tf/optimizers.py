"""Optimizers of the reference implementations."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="elita_tf")
class NormalizedSGD(keras.optimizers.Optimizer):
    """Normalised SGD, the optimizer of 3Lin (Andrey Gulin, `par_matrix.cpp::AddDelta`).

    Every variable moves by exactly `learning_rate` in Frobenius norm per
    step, whatever the gradient's scale:

        w <- w - lr * g / |g|_F                          (skipped when g = 0)

    Variables named in `row_normalized` (3Lin's embedding and final layer)
    move row by row instead, each row `y` scaled by a running mean of its
    squared gradient norms:

        D_y <- decay * D_y + |g_y|^2     (all rows decay; absent rows add 0)
        n   <- decay * n + 1
        w_y <- w_y - lr * g_y / sqrt(D_y / n)            (0 where D_y = 0)

    The reference ascends the summed log-likelihood; this is the same step on
    a loss. No momentum, no weight decay by default. 3Lin's `tailN` schedule
    (`lr * min(1, N (1 - t / T))`) is a learning-rate schedule to pass in.

    Args:
        learning_rate: float, a `keras.optimizers.schedules.LearningRateSchedule`
            or a callable. The Frobenius norm of every step. Defaults to `0.1`.
        row_decay: float in [0, 1). Decay of the row statistics `D` and `n`.
            Defaults to `0.99`.
        row_normalized: None, a list of substrings, or a dict
            `{substring: axis}`. A variable whose `path` contains one of them
            is updated row by row. With a list the rows are indexed by axis 0
            (an `Embedding`'s `[vocab, dim]`); a dict names the axis, e.g.
            `{"final": -1}` for a `Dense` output kernel `[dim, vocab]`, whose
            column `y` belongs to class `y`. Defaults to `None`.
        **kwargs: base `keras.optimizers.Optimizer` arguments (`name`,
            `clipnorm`, `use_ema`, ...).

    Example:
    >>> optimizer = NormalizedSGD(0.1, row_normalized=["embedding"])
    >>> model.compile(optimizer, loss)  # doctest: +SKIP

    References:
        - [3Lin, A. Gulin](https://github.com/F0reseer/3Lin), `code/gpt/model/par_matrix.cpp`.
    """

    def __init__(self, learning_rate=0.1, row_decay=0.99, row_normalized=None, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        if isinstance(row_decay, bool) or not isinstance(row_decay, (int, float)) or not 0.0 <= row_decay < 1.0:
            raise ValueError(f"`row_decay` must be a float in [0, 1). Received: row_decay={row_decay!r}")
        if row_normalized is None:
            axes = {}
        elif isinstance(row_normalized, dict):
            axes = dict(row_normalized)
        elif isinstance(row_normalized, (list, tuple)):
            axes = {pattern: 0 for pattern in row_normalized}
        else:
            raise ValueError(
                "`row_normalized` must be None, a list of substrings or a dict {substring: axis}. "
                f"Received: row_normalized={row_normalized!r}"
            )
        for pattern, axis in axes.items():
            if not isinstance(pattern, str) or not pattern or isinstance(axis, bool) or not isinstance(axis, int):
                raise ValueError(
                    "`row_normalized` entries must be non-empty strings (with integer axes). "
                    f"Received: row_normalized={row_normalized!r}"
                )
        self.row_decay = float(row_decay)
        self.row_normalized = list(row_normalized) if isinstance(row_normalized, tuple) else row_normalized
        self._row_axes = axes

    def _row_axis(self, variable):
        """The axis of `variable`'s rows, or None for a whole-tensor update."""
        path = getattr(variable, "path", None) or variable.name
        for pattern, axis in self._row_axes.items():
            if pattern in path:
                rank = len(variable.shape)
                if not -rank <= axis < rank:
                    raise ValueError(
                        f"`row_normalized` axis {axis} is out of range for variable '{path}' of shape "
                        f"{tuple(variable.shape)}. Received: row_normalized={self.row_normalized!r}"
                    )
                return axis % rank
        return None

    def build(self, variables):
        """Creates `D` (one entry per row) and `n` for every row-normalised variable."""
        if self.built:
            return
        super().build(variables)
        self.row_sums = []
        self.row_counts = []
        for variable in variables:
            axis = self._row_axis(variable)
            if axis is None:
                self.row_sums.append(None)
                self.row_counts.append(None)
                continue
            prefix = (getattr(variable, "path", None) or variable.name).replace("/", "_")
            self.row_sums.append(
                self.add_variable((variable.shape[axis],), dtype=variable.dtype, name=f"{prefix}_row_sums")
            )
            self.row_counts.append(self.add_variable((), dtype=variable.dtype, name=f"{prefix}_row_count"))

    def update_step(self, gradient, variable, learning_rate):
        """One normalised step of `variable` along `-gradient`."""
        dtype = variable.dtype
        learning_rate = ops.cast(learning_rate, dtype)
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            # Embedding gradients arrive as IndexedSlices: dense (repeated rows summed), an absent row adds 0 to D.
            gradient = tf.convert_to_tensor(gradient)
        gradient = ops.cast(gradient, dtype)
        index = self._get_variable_index(variable)
        row_sum = self.row_sums[index]
        if row_sum is None:
            norm = ops.sqrt(ops.sum(ops.square(gradient)))
            self.assign_sub(variable, learning_rate * ops.divide_no_nan(gradient, norm))
            return
        axis = self._row_axis(variable)
        others = [a for a in range(len(variable.shape)) if a != axis]
        decay = ops.cast(self.row_decay, dtype)
        row_count = self.row_counts[index]
        new_sum = decay * row_sum + ops.sum(ops.square(gradient), axis=others)
        new_count = decay * row_count + 1.0
        self.assign(row_sum, new_sum)
        self.assign(row_count, new_count)
        scale = ops.sqrt(new_sum / new_count)
        shape = [-1 if a == axis else 1 for a in range(len(variable.shape))]
        self.assign_sub(variable, learning_rate * ops.divide_no_nan(gradient, ops.reshape(scale, shape)))

    def get_config(self):
        config = super().get_config()
        config.update({"row_decay": self.row_decay, "row_normalized": self.row_normalized})
        return config
