"""keras-hub's own model test harness (`keras_hub.src.tests.test_case.TestCase`) on the one model.

The checks keras-hub runs on its own backbones and tasks: config and serialization
round trips, variable lengths, `predict`, the policy followed by every sublayer and
output under `mixed_float16`, `mixed_bfloat16` and `bfloat16`, int8 and float8
policies through a `DTypePolicyMap`, `.keras` saving, and the task's `predict` and
`fit` with and without its preprocessor.
"""

import numpy as np
import pytest
from keras_hub.src.tests import test_case  # by module: a bare TestCase name would be collected

from elita_tf.data.tokenizer import train_sentencepiece
from elita_tf.models import (
    ARCHITECTURES,
    ElitaBackbone,
    ElitaCausalLM,
    ElitaCausalLMPreprocessor,
    ElitaTokenizer,
    architecture_config,
)

SIZE = {"vocabulary_size": 40, "num_layers": 2, "hidden_dim": 16, "num_heads": 2, "head_dim": 8}
LINES = [f"the cat number {i} sees a dog and a house ." for i in range(300)]


def _init_kwargs(name):
    return architecture_config(name, **SIZE, max_sequence_length=32)


class _Harness(test_case.TestCase):
    """keras-hub's TestCase, driven by pytest (one method call per check)."""

    __test__ = False  # pytest would collect a unittest.TestCase (and tf.test's `test_session`) by itself

    def runTest(self):  # unittest needs a test method to build the case
        pass


@pytest.fixture
def harness():
    case = _Harness()
    case.setUp()
    yield case
    case.tearDown()


@pytest.fixture(scope="module")
def proto():
    return train_sentencepiece(LINES, vocabulary_size=40)


INPUT = {
    "token_ids": np.array([[5, 9, 3, 7, 1, 2, 8, 4]] * 2, "int32"),
    "padding_mask": np.array([[1] * 8, [1] * 6 + [0] * 2], "int32"),
}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_run_backbone_test(harness, name):
    harness.run_backbone_test(
        cls=ElitaBackbone, init_kwargs=_init_kwargs(name), input_data=INPUT, expected_output_shape=(2, 8, 40)
    )


@pytest.mark.parametrize("name", ["elita", "transformer", "3lin"])
def test_run_model_saving_test(harness, name):
    harness.run_model_saving_test(cls=ElitaBackbone, init_kwargs=_init_kwargs(name), input_data=INPUT)


@pytest.mark.parametrize("name", ["elita", "transformer"])
def test_run_task_test(harness, proto, name):
    # Made after the harness's setUp, which clears the session and with it any earlier SentencePiece resource.
    preprocessor = ElitaCausalLMPreprocessor(ElitaTokenizer(proto=proto), sequence_length=12)
    backbone = ElitaBackbone(**_init_kwargs(name))
    harness.run_task_test(
        cls=ElitaCausalLM,
        init_kwargs={"backbone": backbone, "preprocessor": preprocessor},
        train_data=(["the cat sees a dog .", "a house ."],),
        expected_output_shape=(2, 12, 40),
    )
