"""The checks of a layer's call, shared by the layers: inputs, masks and caches, in Keras' form.

The checks of arguments (`num_heads`, `dropout`, `max_sequence_length`) are `elita_tf.checks`, shared
with the settings and the architecture; those of token ids and labels, which the loss shares, are
`elita_tf.ops.utils.token_ids`.
"""

import weakref

import keras
from keras import ops

from elita_tf import backend


def check_float_sequence(layer, inputs):
    """Inputs must be a float `[B, T, d]` sequence (token ids go through an embedding first)."""
    dtype = keras.backend.standardize_dtype(inputs.dtype)
    if "float" not in dtype:
        raise TypeError(
            f"Layer '{layer.name}' expects float inputs of shape [batch, time, width]; "
            f"embed integer token ids first. Received: inputs.dtype={dtype}"
        )


def input_width(inputs_shape):
    """The last axis of a `[B, T, d]` input shape, which must be known to build."""
    width = inputs_shape[-1]
    if width is None:
        raise ValueError(f"The last axis of the inputs must be known. Received: inputs_shape={inputs_shape}")
    return width


def get_activation(name, value):
    """`keras.activations.get(value)`, or a one-line error naming the value Keras cannot read."""
    try:
        return keras.activations.get(value)
    except ValueError:
        raise ValueError(
            f"`{name}` must be a Keras activation, its name (\"gelu\", \"silu\", ...) or None. Received: {name}={value!r}"
        ) from None


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
    if ops.is_tensor(inputs) or isinstance(inputs, keras.KerasTensor):
        return inputs
    return ops.convert_to_tensor(inputs)


def _compatible(shape, other):
    """Whether two shapes (tuples, `None` where unknown) can be the same."""
    return len(shape) == len(other) and all(a is None or b is None or a == b for a, b in zip(shape, other))


def _check_size(size, other, message):
    """A run-time check that two sizes are equal, where either is known only at run time (TensorFlow alone traces
    those); known sizes were checked when the call was traced."""
    if not isinstance(size, int) or not isinstance(other, int):
        backend.check_less_equal(ops.abs(size - other), 0, message)


def check_sequence_call(layer, inputs, padding_mask=None, cache=None):
    """Checks a token mixer's call: a float `[B, T, d]` input, a `[B, T]` mask, a cache of this layer's shapes.

    Static shapes are checked when the call is traced; sizes known only at
    run time get graph assertions.

    Returns:
        `(inputs, padding_mask)`: the inputs in the layer's compute dtype, the
        mask as bool (or None).
    """
    inputs = ops.convert_to_tensor(inputs)
    check_float_sequence(layer, inputs)
    if len(inputs.shape) != 3:
        raise ValueError(
            f"Layer '{layer.name}' expects inputs of shape [batch, time, width]. "
            f"Received: inputs.shape={tuple(inputs.shape)}"
        )
    batch = ops.shape(inputs)[0]
    if padding_mask is not None:
        padding_mask = ops.convert_to_tensor(padding_mask)
        dtype = keras.backend.standardize_dtype(padding_mask.dtype)
        if dtype != "bool" and "int" not in dtype:
            raise TypeError(
                f"Layer '{layer.name}' expects a bool padding_mask [batch, time]. "
                f"Received: padding_mask.dtype={dtype}"
            )
        if not _compatible(tuple(padding_mask.shape), tuple(inputs.shape[:2])):
            raise ValueError(
                f"Layer '{layer.name}' expects padding_mask of shape [batch, time] = {tuple(inputs.shape[:2])}, "
                f"the inputs' first two axes. Received: padding_mask.shape={tuple(padding_mask.shape)}"
            )
        for axis in range(2):
            _check_size(
                ops.shape(padding_mask)[axis],
                ops.shape(inputs)[axis],
                f"Layer '{layer.name}': padding_mask must have the inputs' shape [batch, time]",
            )
        padding_mask = ops.cast(padding_mask, "bool")
    if cache is not None:
        _check_cache(layer, cache, batch, inputs.shape[0])
    return ops.cast(inputs, layer.compute_dtype), padding_mask


_CACHE_SHAPES = weakref.WeakKeyDictionary()


def _cache_shapes(layer):
    """`{name: shape}` of `layer.get_initial_cache(1)`, computed once per layer (the shapes only, static)."""
    if layer not in _CACHE_SHAPES:
        _CACHE_SHAPES[layer] = {name: tuple(t.shape) for name, t in layer.get_initial_cache(1).items()}
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
        tensor = ops.convert_to_tensor(cache[name])
        if len(shape) == 0:
            continue
        if len(tensor.shape) != len(shape) or not _compatible(tuple(tensor.shape[1:]), shape[1:]):
            raise ValueError(
                f"Layer '{layer.name}': cache['{name}'] must have shape [batch, {', '.join(map(str, shape[1:]))}], "
                f"as `get_initial_cache` makes it. Received: shape={tuple(tensor.shape)}"
            )
        if static_batch is not None and tensor.shape[0] is not None and tensor.shape[0] != static_batch:
            raise ValueError(
                f"Layer '{layer.name}': the cache was made for batch size {tensor.shape[0]}, but the inputs "
                f"have batch size {static_batch}. Make it with `get_initial_cache({static_batch})`. "
                f"Received: cache['{name}'].shape={tuple(tensor.shape)}"
            )
        if not batch_checked:  # one run-time check a cache: its entries share the batch axis
            _check_size(
                ops.shape(tensor)[0], batch, f"Layer '{layer.name}': the cache's batch size differs from the inputs'"
            )
            batch_checked = True
