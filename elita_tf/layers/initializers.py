"""Initializer helpers."""

import keras


def clone_initializer(initializer):
    """A fresh copy, so two weights never get the same values.

    A Keras initializer without a seed draws the same values on every call,
    so one instance shared by `k1`, `k2` and `k3` would make them equal.
    """
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())
