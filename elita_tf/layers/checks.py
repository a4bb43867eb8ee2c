"""Argument and input checks shared by the layers, with Keras-style messages."""

import weakref

import keras
import tensorflow as tf


def check_positive_int(name, value, allow_none=False):
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        expected = "None or a positive integer" if allow_none else "a positive integer"
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {sorted(choices, key=str)}. Received: {name}={value!r}")


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


def take_arguments_as_given(layer):
    """Makes `layer` (a token mixer or a block) take its call's arguments unconverted, and pass the Keras mask on.

    Keras would cast every float argument to the compute dtype: a float32
    recurrent cache would silently become float16 under mixed precision.
    `check_sequence_call` converts the inputs instead, and keeps a cache's dtype.
    """
    layer.supports_masking = True
    layer._convert_input_args = False
    layer._allow_non_tensor_positional_args = True


def as_sequence(inputs):
    """Arrays as tensors, so Keras builds from their shapes (the arguments are not converted)."""
    if tf.is_tensor(inputs) or isinstance(inputs, keras.KerasTensor):
        return inputs
    return tf.convert_to_tensor(inputs)


def check_sequence_call(layer, inputs, padding_mask=None, cache=None):
    """Checks a token mixer's call: a float `[B, T, d]` input, a `[B, T]` mask, a cache of this layer's shapes.

    Static shapes are checked when the call is traced; sizes known only at
    run time get graph assertions.

    Returns:
        `(inputs, padding_mask)`: the inputs in the layer's compute dtype, the
        mask as bool (or None).
    """
    inputs = tf.convert_to_tensor(inputs)
    check_float_sequence(layer, inputs)
    if inputs.shape.rank != 3:
        raise ValueError(
            f"Layer '{layer.name}' expects inputs of shape [batch, time, width]. Received: inputs.shape={inputs.shape}"
        )
    batch = tf.shape(inputs)[0]
    if padding_mask is not None:
        padding_mask = tf.convert_to_tensor(padding_mask)
        if padding_mask.dtype != tf.bool and not padding_mask.dtype.is_integer:
            raise TypeError(
                f"Layer '{layer.name}' expects a bool padding_mask [batch, time]. "
                f"Received: padding_mask.dtype={padding_mask.dtype.name}"
            )
        if padding_mask.shape.rank != 2 or not padding_mask.shape.is_compatible_with(inputs.shape[:2]):
            raise ValueError(
                f"Layer '{layer.name}' expects padding_mask of shape [batch, time] = {inputs.shape[:2]}, "
                f"the inputs' first two axes. Received: padding_mask.shape={padding_mask.shape}"
            )
        tf.debugging.assert_equal(
            tf.shape(padding_mask),
            tf.shape(inputs)[:2],
            message=f"Layer '{layer.name}': padding_mask must have the inputs' shape [batch, time]",
        )
        padding_mask = tf.cast(padding_mask, tf.bool)
    if cache is not None:
        _check_cache(layer, cache, batch, inputs.shape[0])
    return tf.cast(inputs, layer.compute_dtype), padding_mask


_CACHE_SHAPES = weakref.WeakKeyDictionary()


def _cache_shapes(layer):
    """`{name: shape}` of `layer.get_initial_cache(1)`, computed once per layer."""
    if layer not in _CACHE_SHAPES:
        with tf.init_scope():
            _CACHE_SHAPES[layer] = {name: t.shape for name, t in layer.get_initial_cache(1).items()}
    return _CACHE_SHAPES[layer]


def _check_cache(layer, cache, batch, static_batch):
    expected = _cache_shapes(layer)
    if not isinstance(cache, dict) or sorted(cache) != sorted(expected):
        given = sorted(cache) if isinstance(cache, dict) else type(cache).__name__
        raise ValueError(
            f"Layer '{layer.name}' expects its cache as `get_initial_cache` makes it: a dict of "
            f"{sorted(expected)}. Received: {given}"
        )
    batch_checked = False
    for name, shape in expected.items():
        tensor = tf.convert_to_tensor(cache[name])
        if shape.rank == 0:
            continue
        if tensor.shape.rank != shape.rank or not tensor.shape[1:].is_compatible_with(shape[1:]):
            raise ValueError(
                f"Layer '{layer.name}': cache['{name}'] must have shape [batch, {', '.join(map(str, shape[1:]))}], "
                f"as `get_initial_cache` makes it. Received: shape={tensor.shape}"
            )
        if static_batch is not None and tensor.shape[0] is not None and tensor.shape[0] != static_batch:
            raise ValueError(
                f"Layer '{layer.name}': the cache was made for batch size {tensor.shape[0]}, but the inputs "
                f"have batch size {static_batch}. Make it with `get_initial_cache({static_batch})`. "
                f"Received: cache['{name}'].shape={tensor.shape}"
            )
        if not batch_checked:  # one run-time check a cache: its entries share the batch axis
            tf.debugging.assert_equal(
                tf.shape(tensor)[0],
                batch,
                message=f"Layer '{layer.name}': the cache's batch size differs from the inputs'",
            )
            batch_checked = True


def check_integer_ids(token_ids, vocabulary_size, name="token_ids"):
    """Token ids as a tensor; a float (or any non-integer) dtype is a `TypeError`, never a cast."""
    token_ids = tf.convert_to_tensor(token_ids)
    if not token_ids.dtype.is_integer:
        raise TypeError(
            f"Token ids must be integers in [0, {vocabulary_size}); float ids are refused, not rounded. "
            f"Received: {name}.dtype={token_ids.dtype.name}"
        )
    return token_ids


def check_token_ids(token_ids, vocabulary_size, name="token_ids"):
    """Token ids must be integers in `[0, vocabulary_size)`: floats are refused, never rounded.

    Eagerly, an id out of range raises `ValueError` at once. In a graph the
    check is an assertion on `O(B * T)` integer compares that fails the step
    with the first offending ids and their positions. XLA drops assertions,
    so callers also mark what an out-of-range id produces (see
    `TokenEmbedding`).

    Returns:
        `(token_ids, in_range)`: the ids (depending on the assertion in a
        graph) and a bool tensor of their shape.
    """
    token_ids = check_integer_ids(token_ids, vocabulary_size, name)
    in_range = (token_ids >= 0) & (token_ids < tf.cast(vocabulary_size, token_ids.dtype))
    message = f"Token ids must be in [0, vocabulary_size={vocabulary_size})."
    if tf.executing_eagerly():
        outside = tf.where(tf.logical_not(in_range))
        if outside.shape[0]:
            first = tuple(int(i) for i in outside[0].numpy())
            value = int(tf.gather_nd(token_ids, outside[:1])[0])
            raise ValueError(f"{message} Received: {name}[{', '.join(map(str, first))}]={value}")
        return token_ids, in_range

    def report():
        # Computed only when an id is out of range: the offending ids and their positions.
        outside = tf.where(tf.logical_not(in_range))[:3]
        data = [message, f"Received: {name} =", tf.gather_nd(token_ids, outside), "at", outside]
        with tf.control_dependencies([tf.debugging.Assert(False, data, summarize=12)]):
            return tf.constant(False)

    checked = tf.cond(tf.reduce_all(in_range), lambda: tf.constant(True), report)
    with tf.control_dependencies([checked]):
        return tf.identity(token_ids), in_range
