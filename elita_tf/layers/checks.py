"""Argument and input checks shared by the layers, with Keras-style messages."""

import tensorflow as tf


def check_positive_int(name, value, allow_none=False):
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        expected = "None or a positive integer" if allow_none else "a positive integer"
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {sorted(choices)}. Received: {name}={value!r}")


def check_float_sequence(layer, inputs):
    """Inputs must be a float `[B, T, d]` sequence (token ids go through an embedding first)."""
    dtype = tf.as_dtype(inputs.dtype)
    if not dtype.is_floating:
        raise TypeError(
            f"Layer '{layer.name}' expects float inputs of shape [batch, time, width]; "
            f"embed integer token ids first. Received: inputs.dtype={dtype.name}"
        )


def input_width(inputs_shape):
    """The last axis of a `[B, T, d]` input shape, which must be known to build."""
    width = inputs_shape[-1]
    if width is None:
        raise ValueError(f"The last axis of the inputs must be known. Received: inputs_shape={inputs_shape}")
    return width
