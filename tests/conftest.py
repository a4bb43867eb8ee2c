import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def policy():
    """Sets a global dtype policy for one test and restores the default after it."""
    previous = keras.config.dtype_policy()
    yield keras.config.set_dtype_policy
    keras.config.set_dtype_policy(previous)
