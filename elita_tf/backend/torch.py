"""The PyTorch side of `elita_tf.backend`."""

import keras
import torch

from elita_tf.private_apis import torch_device


def compiled_or_on_gpu():
    return torch.compiler.is_compiling() or torch.cuda.is_available()


def branch_or_select(usual, fast, general):
    """Eager on a CPU, a Python branch on the value; compiled or on a GPU, `general()` alone (no host sync).

    A tensor on the `"meta"` device (Keras' shape inference, `compute_output_spec`) has no value: `general()`,
    whose shapes are `fast()`'s. A branch there would send Keras to its fallback, a whole forward pass on real
    tensors of the batch's shape, the full `[B, T, V]` logits among them, in the first training step.
    """
    if compiled_or_on_gpu() or usual.device.type == "meta":
        return general()
    return fast() if bool(usual) else general()


def cumulative_logsumexp(x, axis, reverse=False):
    if reverse:
        return torch.flip(torch.logcumsumexp(torch.flip(x, [axis]), axis), [axis])
    return torch.logcumsumexp(x, axis)


def custom_gradient(with_gradient):
    """Keras' `custom_gradient`, but the backward pass holds only what the gradient function holds.

    Keras' PyTorch one saves every input of the op for the backward pass (`ctx.save_for_backward(*args)`),
    whether the gradient reads it or not: a norm's input, which its gradient never reads, is the residual
    stream, so every block held two `[B, T, d]` tensors more than on TensorFlow and JAX. Here, as there,
    the gradient function's closure holds what it needs until the backward pass has run.
    """

    def call(*args):
        return _CustomGradient.apply(with_gradient, *args)

    return call


class _CustomGradient(torch.autograd.Function):
    """`with_gradient(*args) -> (outputs, gradient)` (no gradient recorded inside), `gradient(*upstreams)` after."""

    @staticmethod
    def forward(ctx, with_gradient, *args):
        outputs, ctx.gradient = with_gradient(*args)
        return outputs

    @staticmethod
    def backward(ctx, *upstreams):
        gradients, ctx.gradient = ctx.gradient(*upstreams), None  # what it held goes with it
        return (None, *gradients)


def full(shape, value, dtype):
    """Keras' `full` from a Python number: Keras' own makes the number a tensor first and reads it back, which a
    `"meta"` tensor (Keras' shape inference) cannot do."""
    dtype = getattr(torch, keras.backend.standardize_dtype(dtype))
    return torch.full(tuple(shape), value, dtype=dtype, device=torch_device())


def ordered(after, compute):
    return compute()


def matmul(a, b, transpose_a=False, transpose_b=False):
    """`torch.matmul`, but a large float32 product of rows with a matrix on the CPU goes to oneDNN.

    PyTorch's CPU build takes float32 products to MKL's BLAS, which on AMD's CPUs runs at 100-200 GFLOP/s where
    oneDNN (the library TensorFlow's CPU products use) runs at 330-470 on the same cores: 2.5x less time for
    the output head's and FeedForward2's products (docs/benchmarks.md, "Where the step goes"). oneDNN's product
    is float32 throughout, as MKL's (no reduced-precision mode); only the order of the sums differs.
    """
    a, b = a.mT if transpose_a else a, b.mT if transpose_b else b
    if _by_onednn(a, b):
        return _OneDnnProduct.apply(a, b)
    return torch.matmul(a, b)


# Below this many multiply-adds oneDNN's fixed cost (about 10 microseconds a call) outweighs its speed.
_ONEDNN_LEAST_PRODUCT = 1 << 22
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _by_onednn(a, b):
    """Whether `a [..., m, k] @ b [k, n]` goes to oneDNN: float32 on the CPU, eager, and large enough."""
    return (
        _ONEDNN
        and a.dtype == b.dtype == torch.float32
        and a.device.type == b.device.type == "cpu"
        and b.ndim == 2
        and a.ndim >= 2
        and a.numel() * b.shape[1] >= _ONEDNN_LEAST_PRODUCT
        and not torch.compiler.is_compiling()
    )


def _onednn_product(a, b):
    """`a [..., k] @ b [k, n]` by oneDNN's inner product (`b`'s transpose as its `[n, k]` weight)."""
    rows = a.reshape(-1, a.shape[-1])
    product = torch.ops.mkldnn._linear_pointwise(rows, b.mT, None, "none", [], "")
    return product.reshape(*a.shape[:-1], b.shape[1])


class _OneDnnProduct(torch.autograd.Function):
    """`a @ b` by oneDNN, with the gradients autograd takes for `torch.matmul` (oneDNN's op has none): `g bᵀ`
    and `aᵀ g`, each again through `matmul`."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _onednn_product(a, b)

    @staticmethod
    def backward(ctx, upstream):
        a, b = ctx.saved_tensors
        d_a = matmul(upstream, b, transpose_b=True) if ctx.needs_input_grad[0] else None
        if not ctx.needs_input_grad[1]:
            return d_a, None
        rows, upstream_rows = a.reshape(-1, a.shape[-1]), upstream.reshape(-1, upstream.shape[-1])
        return d_a, matmul(rows, upstream_rows, transpose_a=True)


def _like(x, other):
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=other.dtype, device=other.device)


def maximum(a, b):
    return torch.maximum(_like(a, b), _like(b, a))


def minimum(a, b):
    return torch.minimum(_like(a, b), _like(b, a))


def check_less_equal(x, limit, message):
    """Eagerly, a check of the values; compiled, or on the `"meta"` device of Keras' shape inference, none (there
    are no values to read)."""
    if torch.compiler.is_compiling():
        return
    x, limit = torch.as_tensor(x), torch.as_tensor(limit)
    if "meta" not in (x.device.type, limit.device.type) and not bool(torch.all(x <= limit)):
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
