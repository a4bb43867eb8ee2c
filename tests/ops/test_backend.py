import numpy as np
import pytest
from keras import ops

from elita_tf import backend


@pytest.mark.tf_only
def test_a_value_ordered_after_its_check_is_read_only_once_the_check_passed():
    # In a graph TensorFlow runs ops whose inputs are ready, in any order: without the control input, a
    # gather past the table may fail first, with TensorFlow's message instead of the check's (flaky in CI).
    import tensorflow as tf

    table = tf.constant([10, 20, 30])

    @tf.function
    def read(index):
        checked = backend.check_less_equal(index, 2, "index is past the table")
        return tf.gather(table, backend.ordered([checked], lambda: ops.copy(index)))

    graph = read.get_concrete_function(tf.TensorSpec([], tf.int32)).graph
    (gather,) = [op for op in graph.get_operations() if op.type.startswith("Gather")]
    assert [op.type for op in gather.inputs[1].op.control_inputs] == ["Assert"]
    assert int(read(tf.constant(2))) == 30
    for _ in range(20):
        with pytest.raises(tf.errors.InvalidArgumentError, match="index is past the table"):
            read(tf.constant(3))


def test_ordered_ignores_a_check_with_nothing_to_order():
    x = ops.convert_to_tensor(np.arange(3), "int32")
    checked = backend.check_less_equal(ops.max(x), 2, "x is at most 2")  # eager: raised already, or passed
    np.testing.assert_array_equal(ops.convert_to_numpy(backend.ordered([checked], lambda: ops.copy(x))), [0, 1, 2])


def _custom_gradient_ops():
    from elita_tf.ops import causal_softmax_mean, chunked_cross_entropy, unscaled_layer_norm
    from elita_tf.ops.gated_projection import gated_output_projection
    from elita_tf.ops.pairwise_projection import pairwise_projection

    # Each takes `values [2, 40, 8]`.
    labels, kernel, heads_kernel = ops.zeros([2, 40], "int32"), ops.ones([8, 50]), ops.ones([2, 3, 8])
    return {
        "layer norm": lambda v: unscaled_layer_norm(v),
        "causal mean": lambda v: causal_softmax_mean(v[None, ..., 0], v[None])[0],
        "gated projection": lambda v: gated_output_projection(v[None], 2 * v[None], v[None, ..., 0], heads_kernel),
        "pairwise projection": lambda v: pairwise_projection(v[0], v[1], ops.ones([8, 8, 3]), swish=True),
        "cross-entropy": lambda v: chunked_cross_entropy(v, kernel, labels, chunk_size=16),
    }


@pytest.mark.skipif(ops.convert_to_tensor(0).__class__.__module__ != "torch", reason="PyTorch's autograd graph")
@pytest.mark.parametrize("name", list(_custom_gradient_ops()))
def test_a_custom_gradients_graph_goes_with_its_outputs(name):
    # A gradient may keep its op's output (the norm's reads its `y`). Were that the tensor autograd attaches the node
    # to, the node would hold itself: a cycle that Python's collector cannot free once a later op holds the node too.
    # Every training step kept its graph (512 MiB a step at the seed size).
    import gc
    import weakref

    import torch

    from elita_tf.ops import unscaled_layer_norm

    values = torch.randn(2, 40, 8, dtype=torch.float32, requires_grad=True)
    outputs = _custom_gradient_ops()[name](values)
    following = unscaled_layer_norm(outputs * 2.0)  # a later op, as in a model
    (following * torch.randn(following.shape)).sum().backward()
    alive = weakref.ref(outputs)
    del outputs, following
    gc.collect()
    assert alive() is None
    assert values.grad is not None


@pytest.mark.skipif(ops.convert_to_tensor(0).__class__.__module__ != "torch", reason="PyTorch's CPU products")
@pytest.mark.parametrize(
    "shapes",
    [((512, 65), (65, 5000), False, False), ((2, 256, 64), (64, 512), False, False),
     ((512, 5000), (64, 5000), False, True), ((65, 512), (65, 5000), True, False)],
    ids=["head", "rows", "transposed_b", "transposed_a"],
)  # fmt: skip
def test_a_large_float32_product_goes_to_onednn_with_the_gradients_of_a_product(shapes):
    # oneDNN's float32 product (the one TensorFlow's CPU products use) takes 2.5x less time than MKL's on AMD CPUs.
    # It has no gradient of its own: `backend.matmul` gives it a product's, and a small or float64 product stays
    # torch.matmul's.
    import torch

    from elita_tf.backend import torch as torch_backend

    shape_a, shape_b, transpose_a, transpose_b = shapes
    generator = torch.Generator().manual_seed(0)
    a64, b64 = (torch.randn(*s, dtype=torch.float64, generator=generator) for s in (shape_a, shape_b))
    upstream = None
    gradients = {}
    for dtype in (torch.float64, torch.float32):
        a, b = (x.to(dtype).clone().requires_grad_() for x in (a64, b64))
        taken = torch_backend._by_onednn(a.mT if transpose_a else a, b.mT if transpose_b else b)
        assert taken == (dtype == torch.float32)
        product = backend.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
        assert (product.grad_fn.name() == "_OneDnnProductBackward") == taken
        if upstream is None:
            upstream = torch.randn(product.shape, dtype=torch.float64, generator=generator)
        product.backward(upstream.to(dtype))
        gradients[dtype] = (product, a.grad, b.grad)
    for value, reference in zip(gradients[torch.float32], gradients[torch.float64]):
        error = (value.detach().double() - reference.detach()).abs().max() / reference.abs().max()
        assert error < 1e-5, error
    small = torch.ones(8, 8, requires_grad=True)
    assert not torch_backend._by_onednn(small, small) and backend.matmul(small, small).grad_fn.name() == "MmBackward0"


@pytest.mark.skipif(ops.convert_to_tensor(0).__class__.__module__ != "torch", reason="PyTorch's autograd graph")
def test_a_custom_gradient_holds_no_input_that_its_gradient_does_not_read():
    # Keras' PyTorch custom_gradient saves every input for the backward pass. A norm's gradient reads its output, not
    # its input, which in a model is the residual stream: two [B, T, d] tensors a block held for nothing.
    import gc
    import weakref

    import torch

    from elita_tf.ops import unscaled_layer_norm

    values = torch.randn(2, 40, 8, dtype=torch.float32, requires_grad=True)
    inputs = values * 2.0
    outputs = unscaled_layer_norm(inputs)
    alive = weakref.ref(inputs)
    del inputs
    gc.collect()
    assert alive() is None
    upstream = torch.randn(outputs.shape)
    (outputs * upstream).sum().backward()
    reference = values.detach().clone().requires_grad_()
    doubled = reference * 2.0
    centred = doubled - doubled.mean(-1, keepdim=True)
    (centred / torch.sqrt(centred.square().mean(-1, keepdim=True) + 1e-3) * upstream).sum().backward()
    np.testing.assert_allclose(values.grad.numpy(), reference.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(ops.convert_to_tensor(0).__class__.__module__ != "torch", reason="PyTorch's tensors and views")
def test_a_mixer_sees_its_finite_inputs_without_a_copy():
    # The mixer's projections keep their input for the backward pass; the norm's output is kept already. A copy of it
    # (`ops.copy` clones on PyTorch) was a third [B, T, d] tensor a block held.
    from elita_tf.ops.utils.nonfinite import contain_nonfinite

    inputs = ops.convert_to_tensor(np.random.default_rng(0).normal(size=(2, 5, 3)), "float32")
    seen = []
    outputs = contain_nonfinite(lambda clean: seen.append(clean) or clean * 1.0, inputs)
    (clean,) = seen
    assert clean is not inputs and clean.data_ptr() == inputs.data_ptr()
    np.testing.assert_array_equal(ops.convert_to_numpy(outputs), ops.convert_to_numpy(inputs))
