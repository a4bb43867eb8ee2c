"""A `.keras` file of every mixer, saved on this backend, loads on each other backend with the same outputs.

Each other backend runs in its own process (Keras picks its backend once, at import). It is skipped
where that backend is not installed: CI installs all three for the JAX and PyTorch runs.
"""

import importlib.util

import keras
import numpy as np
import pytest

from tests.backend_utils import BACKEND, numpy, run_on_backend
from tests.layers.test_mixer_contract import MIXERS, WIDTH, _inputs, _mixer

_LOAD_AND_CALL = """
import sys, numpy as np, keras
from elita_tf.layers import *  # noqa: F403 (each layer registers its class with Keras as it loads)
directory, names = sys.argv[1], sys.argv[2:]
x = np.load(f"{directory}/inputs.npy")
outputs = {}
for name in names:
    model = keras.models.load_model(f"{directory}/{name}.keras")
    outputs[name] = keras.ops.convert_to_numpy(model(x))
    # A prefill and four steps from its cache (eager JAX runs each step op by op).
    y, cache = model.layers[-1](x[:, :36], cache=model.layers[-1].get_initial_cache(x.shape[0]))
    steps = [keras.ops.convert_to_numpy(y)]
    for t in range(36, x.shape[1]):
        y, cache = model.layers[-1](x[:, t : t + 1], cache=cache)
        steps.append(keras.ops.convert_to_numpy(y))
    outputs[name + "/decoded"] = np.concatenate(steps, 1)
np.savez(f"{directory}/outputs.npz", **outputs)
"""


@pytest.mark.parametrize("other", [b for b in ("tensorflow", "jax", "torch") if b != BACKEND])
def test_keras_files_load_on_the_other_backend_with_the_same_outputs(other, tmp_path):
    """Outputs, and decoding from the cache there, agree within 1e-4 of the largest output."""
    if importlib.util.find_spec(other) is None:
        pytest.skip(f"{other} is not installed")
    x = _inputs(40)
    np.save(tmp_path / "inputs.npy", x)
    want = {}
    for name in sorted(MIXERS):
        layer = _mixer(name)
        inputs = keras.Input((None, WIDTH))
        model = keras.Model(inputs, layer(inputs))
        model.save(tmp_path / f"{name}.keras")
        want[name] = want[name + "/decoded"] = numpy(model(x))
    run_on_backend(other, _LOAD_AND_CALL, tmp_path, *sorted(MIXERS))
    got = np.load(tmp_path / "outputs.npz")
    for key, value in want.items():
        scale = np.abs(value).max()
        np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-4 * scale, err_msg=f"{key} on {other}")
