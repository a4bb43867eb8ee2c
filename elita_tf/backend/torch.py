"""The PyTorch side of `elita_tf.backend`."""

import torch


def compiled_or_on_gpu():
    return torch.compiler.is_compiling() or torch.cuda.is_available()


def branch_or_select(usual, fast, general):
    """Eager on a CPU, a Python branch on the value; compiled or on a GPU, `general()` alone (no host sync)."""
    if compiled_or_on_gpu():
        return general()
    return fast() if bool(usual) else general()


def cumulative_logsumexp(x, axis, reverse=False):
    if reverse:
        return torch.flip(torch.logcumsumexp(torch.flip(x, [axis]), axis), [axis])
    return torch.logcumsumexp(x, axis)


def ordered(after, compute):
    return compute()


def matmul(a, b, transpose_a=False, transpose_b=False):
    return torch.matmul(a.mT if transpose_a else a, b.mT if transpose_b else b)


def _like(x, other):
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=other.dtype, device=other.device)


def maximum(a, b):
    return torch.maximum(_like(a, b), _like(b, a))


def minimum(a, b):
    return torch.minimum(_like(a, b), _like(b, a))


def check_less_equal(x, limit, message):
    if not torch.compiler.is_compiling():
        x, limit = torch.as_tensor(x), torch.as_tensor(limit)
        if not bool(torch.all(x <= limit)):
            raise ValueError(f"{message}. Received: {x.cpu().numpy()} > {limit.cpu().numpy()}")


def check_all(condition, message, report):
    """Traced (`jit`, `torch.compile`, Keras' symbolic build) there is nothing to raise from: the caller checks known
    values itself."""
    return None


def cumsum(x, axis, exclusive=False):
    """`torch.cumsum` in `x`'s dtype (Keras' `ops.cumsum` on PyTorch turns float64 into float32)."""
    total = torch.cumsum(x, dim=axis)
    if not exclusive:
        return total
    axis = axis % x.ndim
    pad = [0, 0] * (x.ndim - 1 - axis) + [1, 0]  # one zero in front (torch lists the last axis first)
    return torch.nn.functional.pad(total, pad).narrow(axis, 0, total.shape[axis])


def scan(step, init, xs):
    """A Python loop over axis 0 of `xs` (eager PyTorch)."""
    import keras

    carry, ys = init, []
    for k in range(keras.tree.flatten(xs)[0].shape[0]):
        carry, y = step(carry, keras.tree.map_structure(lambda x: x[k], xs))
        ys.append(y)
    return carry, keras.tree.map_structure(lambda *y: torch.stack(y), *ys)


def segment_sum(data, segment_ids, num_segments):
    """In `data`'s dtype (Keras' PyTorch `segment_sum` sums float64 in float32)."""
    total = torch.zeros((num_segments, *data.shape[1:]), dtype=data.dtype, device=data.device)
    return total.index_add(0, segment_ids.long(), data)


def no_gradient():
    return torch.no_grad()


def unlinked(outputs):
    """New tensors over the outputs' memory. Autograd attaches its node to the tensor a custom gradient returns;
    were that the tensor its gradient keeps, the node would hold itself through the gradient, a cycle through C++
    that Python's collector cannot see, and each step would keep its whole graph (512 MiB a step at the seed
    size, until memory ran out)."""
    import keras

    return keras.tree.map_structure(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, outputs)
