"""What `keras.ops` lacks, one module a Keras backend: the ops call these, never a backend by name.

    compiled_or_on_gpu()                  whether the code is compiled (XLA, `jit`, `torch.compile`) or on a GPU
    branch_or_select(usual, fast, general)
                                          `fast()` where `usual` holds, else `general()`: a branch where that is
                                          cheap, `general()` alone where a branch would cost more
    cumsum(x, axis, exclusive=False)      a cumulative sum in `x`'s dtype (`ops.cumsum` on PyTorch makes float64
                                          float32); `exclusive` sums the entries before each (TensorFlow's form)
    cumulative_logsumexp(x, axis, reverse=False)
    ordered(after, compute)               `compute()` once the tensors `after` exist (TensorFlow's control
                                          dependencies keep a backward pass from forming everything at once)
    check_less_equal(x, limit, message)   a run-time check, where the backend can raise one; returns it, for
                                          `ordered` (None where there is nothing to order)
    check_all(condition, message, report) a run-time check in a TensorFlow graph, reporting `report()` when it fails
    custom_gradient(forward)              `forward(*tensors) -> (outputs, grad)`, `grad(upstream)` returning
                                          one gradient per tensor; nothing differentiated is closed over
    unlinked(outputs)                     a custom gradient's outputs as the tensors it returns: on PyTorch new
                                          tensors over the same memory, so that a gradient may keep an output
    scan(step, init, xs)                  `jax.lax.scan`: `step(carry, x) -> (carry, y)` along axis 0 of the nest
                                          `xs`, one step at a time; returns the last carry and the stacked `y`s
    full(shape, value, dtype)             `ops.full` of a Python number (on PyTorch also on the `"meta"` device of
                                          Keras' shape inference, where Keras' own refuses it)
    matmul(a, b, transpose_a=False, transpose_b=False)
    no_gradient()                         a context in which nothing is recorded for a backward pass (PyTorch's
                                          autograd records every op it is not told to leave out)
    segment_sum(data, segment_ids, num_segments)
    maximum(a, b), minimum(a, b)          in the inputs' dtype (Keras' PyTorch backend takes float64 to
                                          float32 in these); TensorFlow's transposes folded into the product

The module of the backend Keras runs on is chosen when this package is first imported, as Keras
chooses its own.
"""

import keras

_BACKEND = keras.backend.backend()
if _BACKEND == "tensorflow":
    from elita_tf.backend import tensorflow as _module
elif _BACKEND == "jax":
    from elita_tf.backend import jax as _module
elif _BACKEND == "torch":
    from elita_tf.backend import torch as _module
else:
    raise ImportError(
        f"elita_tf's layers run on the TensorFlow, JAX and PyTorch backends of Keras. Received: {_BACKEND!r}"
    )

branch_or_select = _module.branch_or_select
check_all = _module.check_all
check_less_equal = _module.check_less_equal
compiled_or_on_gpu = _module.compiled_or_on_gpu
cumsum = _module.cumsum
cumulative_logsumexp = _module.cumulative_logsumexp
full = _module.full
matmul = _module.matmul
maximum = _module.maximum
minimum = _module.minimum
no_gradient = _module.no_gradient
ordered = _module.ordered
scan = _module.scan
segment_sum = _module.segment_sum
unlinked = _module.unlinked


def custom_gradient(forward):
    """`keras.ops.custom_gradient` for `forward(*tensors) -> (outputs, grad)`, with `grad(upstream)` on every backend.

    Keras calls the gradient function as `grad(upstream)` on TensorFlow and JAX and as
    `grad(*inputs, upstream=upstream)` on PyTorch; this takes both. `forward` must close over no
    tensor that is differentiated (JAX refuses it): whatever the gradient needs is an argument. The
    gradient may keep an output (a norm's gradient reads its `y`): what is returned is `unlinked` from it.
    The backward pass holds what the gradient function holds, and nothing else (on PyTorch Keras' own would
    also hold every input: `elita_tf.backend.torch.custom_gradient`).
    """

    def with_gradient(*args):
        outputs, grad = forward(*args)
        outputs = unlinked(outputs)

        def gradient(*upstreams, upstream=None):
            return tuple(grad(upstreams[0] if upstream is None else upstream))

        return outputs, gradient

    return _module.custom_gradient(with_gradient)
