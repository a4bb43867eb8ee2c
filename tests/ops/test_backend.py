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
