import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if os.environ.get("KERAS_BACKEND") == "jax":  # float64 references and inputs, as on the other backends
    import jax

    jax.config.update("jax_enable_x64", True)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "tf_only: TensorFlow by nature (tf.data, SavedModel, LiteRT, HLO, tf.distribute)")
    config.addinivalue_line("markers", "tensorflow_version: what TensorFlow's version can change (TENSORFLOW_VERSION)")


# What also runs on JAX and PyTorch (`KERAS_BACKEND=jax|torch python -m pytest`): the ops, the layers, the model,
# its optimizers, elita-train and its resuming on that backend, and the step's profile. The rest (the data pipeline,
# the SavedModel and LiteRT exports, tf.distribute, the commands' own checks) runs on TensorFlow, with which every
# backend's runs and presets are read.
EVERY_BACKEND = (
    "tests/ops/",
    "tests/layers/",
    "tests/models/test_every_backend.py",
    "tests/models/test_keras_hub_harness.py",
    "tests/training/test_backend_resume.py",
    "tests/training/test_other_backends.py",
    "tests/training/test_distribution.py",
    "tests/test_optimizers.py",
    "tests/test_profile_step.py",
)
# Eager JAX on the CPU is an order slower than the other backends (the whole EVERY_BACKEND set ran past 55
# minutes on 2 cores and did not finish; PyTorch's takes 7). By default JAX runs this part of it: the model,
# elita-train and elita-evaluate, keras.distribution over 4 host devices, the optimizers, keras-hub's harness, .keras
# files across backends, the loss and the smaller ops, every mixer's decoding and saving checks, a full decoding
# buffer under `jit`, and the GPU script's JAX side (under 20 minutes on 2 cores). ELITA_JAX_TESTS=all runs all of it.
ON_JAX = (
    "tests/models/test_every_backend.py",
    "tests/training/test_backend_resume.py",
    "tests/training/test_other_backends.py",
    "tests/training/test_distribution.py",
    "tests/test_optimizers.py",
    "tests/models/test_keras_hub_harness.py",
    "tests/layers/test_across_backends.py",
    "tests/ops/test_cross_entropy.py",
    "tests/ops/test_gated_projection.py",
    "tests/ops/test_layer_norm.py",
    "tests/ops/test_linear_attention.py",
    "tests/ops/test_short_convolution.py",
    "tests/ops/test_utils.py",
    "tests/layers/test_mixer_contract.py::test_prefill_chunks_and_steps_from_the_named_cache_equal_the_parallel_form",
    "tests/layers/test_mixer_contract.py::test_config_and_keras_file_round_trip",
    "tests/layers/test_mixer_contract.py::test_a_compiled_step_past_a_full_buffer_gives_nan_not_a_plausible_output",
    # The GPU script's quick mode with its JAX side (the TensorFlow stages have no JAX), that side alone, and the
    # Zoology recall grid's script.
    "tests/test_gpu_script.py::test_the_gpu_script_runs_every_measurement_in_quick_mode",
    "tests/test_gpu_script.py::test_the_jax_step_and_its_profile_run_without_tensorflow",
    "tests/test_gpu_script.py::test_the_zoology_recall_grid_runs_on_jax_without_tensorflow",
)


# What the version of TensorFlow (and of tensorflow-text and keras-hub, which move with it) can change: the data
# pipeline and tensorflow-text, the SavedModel and LiteRT exports, tf.distribute (a mirrored run and the workers),
# one `elita-train` run end to end with its exact resumption, keras-hub's harness, the notebook, and every test
# marked tf_only. On the oldest supported TensorFlow CI runs these (`-m tensorflow_version`, docs/install.md); the
# rest runs on the newest TensorFlow, and on JAX and PyTorch where it is in EVERY_BACKEND: the ops' and layers'
# numerics (the same `keras.ops` code on every backend), the commands' own checks and settings (Python's), a run
# directory's locks and its recovery from kill -9 and damaged files (Python's and the file system's), `elita-recall`,
# the GPU scripts and the benchmarks.
TENSORFLOW_VERSION = (
    "tests/data/",
    "tests/export/",
    "tests/training/test_cli.py::test_train_end_to_end_and_exact_resumption",
    "tests/training/test_cli.py::test_mirrored_strategy_over_two_cpu_devices",
    "tests/training/test_multiworker.py",
    "tests/models/test_keras_hub_harness.py",
    "tests/test_notebook.py",
)


# Where a stage repeats per architecture what another stage tests in full, it runs one architecture per design. The
# variants (a design's original settings, `-reference`, `-wide`, or designs combined, `-conv`, `-hybrid`) are
# `keras.ops` code of the designs' layers, which every backend tests layer by layer: every architecture runs on the
# newest TensorFlow, the designs alone on JAX and PyTorch (ELITA_JAX_TESTS=all, ELITA_TORCH_TESTS=all: every
# architecture) and on the oldest TensorFlow.
DESIGNS = ("3lin", "additive", "elita", "linear", "simplified", "transformer")
# What test_every_backend.py runs per architecture and TensorFlow's own tests run there per architecture in more depth
# (test_elita_causal_lm.py: training compiled and not, every weight moving, greedy decoding, LoRA and int8 on every
# projection): on TensorFlow these run ELiTA alone.
DEEPER_ON_TENSORFLOW = (
    "tests/models/test_every_backend.py::test_fit_lowers_the_loss_and_moves_every_weight",
    "tests/models/test_every_backend.py::test_greedy_generate_is_the_argmax_of_the_parallel_forward",
    "tests/models/test_every_backend.py::test_lora_trains_only_its_adapters_and_merges_and_int8_stays_close",
)


def _path(config, item):
    return os.path.relpath(str(item.path), str(config.rootpath)).replace(os.sep, "/")


def _variant(item):
    """Whether `item` is a variant's case of a sweep over the architectures (a `name` parametrization that includes
    every design; a test of chosen architectures, such as the three output heads, runs all of its cases)."""
    sweep = next((m.args[1] for m in item.iter_markers("parametrize") if m.args[0] == "name"), ())
    name = getattr(item, "callspec", None) and item.callspec.params.get("name")
    return set(DESIGNS) <= set(sweep) and name not in DESIGNS


def _deselect(config, items, keep):
    kept = {id(item) for item in items if keep(item)}
    config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
    items[:] = [item for item in items if id(item) in kept]


def pytest_collection_modifyitems(config, items):
    backend = keras.backend.backend()
    if backend == "tensorflow":
        deeper = DEEPER_ON_TENSORFLOW
        _deselect(config, items, lambda item: "[elita]" in item.nodeid or not item.nodeid.startswith(deeper))
        for item in items:
            if ("tf_only" in item.keywords or item.nodeid.startswith(TENSORFLOW_VERSION)) and not _variant(item):
                item.add_marker(pytest.mark.tensorflow_version)
        return
    every = os.environ.get(f"ELITA_{backend.upper()}_TESTS") == "all"
    if backend == "jax" and not every:
        _deselect(config, items, lambda item: item.nodeid.startswith(ON_JAX) and not _variant(item))
    else:
        here = lambda item: _path(config, item).startswith(EVERY_BACKEND) and (every or not _variant(item))  # noqa: E731
        _deselect(config, items, here)
    skip = pytest.mark.skip(reason=f"TensorFlow by nature; Keras runs on {backend}")
    for item in items:
        if "tf_only" in item.keywords:
            item.add_marker(skip)


# The files of a keras-hub preset of an ElitaCausalLM with its preprocessor, and nothing else.
PRESET_FILES = ["assets", "config.json", "metadata.json", "model.weights.h5", "preprocessor.json", "task.json"]
PRESET_FILES += ["tokenizer.json"]


@pytest.fixture(scope="session", autouse=True)
def token_cache(tmp_path_factory):
    """The tests' own cache of tokenized splits (`ELITA_CACHE_DIR`), never the user's."""
    os.environ["ELITA_CACHE_DIR"] = str(tmp_path_factory.mktemp("elita-cache"))
    return os.environ["ELITA_CACHE_DIR"]


@pytest.fixture
def policy():
    """Sets a global dtype policy for one test and restores the default after it."""
    previous = keras.config.dtype_policy()
    yield keras.config.set_dtype_policy
    keras.config.set_dtype_policy(previous)


def token_file(lines, tokenizer, directory, vocabulary_size=None):
    """A split's token files, written as `elita-train` writes them, from a `tf.data.Dataset` of lines or of
    `(line, starts_document)` pairs: a `TokenFile`."""
    from elita_tf.data.token_files import write_token_file

    return write_token_file(lines, tokenizer, str(directory), vocabulary_size)


def write_tiny_wikitext(directory, lines_per_split=(400, 60, 60), seed=0):
    """A small corpus in WikiText's layout: headings, blank lines, sentences with structure to learn."""
    import random

    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "the old king", "my friend", "the river", "a small bird"]
    verbs = ["sees", "likes", "follows", "finds", "remembers", "crosses"]
    objects = ["the garden", "a red house", "the long road", "an apple", "the quiet town", "the bridge"]
    os.makedirs(directory, exist_ok=True)
    for stem, count in zip(["train", "valid", "test"], lines_per_split):
        with open(os.path.join(directory, f"wiki.{stem}.tokens"), "w", encoding="utf-8") as f:
            for i in range(count):
                if i % 20 == 0:
                    f.write(f" \n = Heading {i // 20} = \n \n")
                words = [f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} ." for _ in range(3)]
                f.write(" " + " ".join(words) + " \n")
    return directory


# elita-train's flags for a model small enough to train in seconds on its own text (`write_documents`).
TINY_RUN = ["--vocabulary-size", "40", "--sequence-length", "16", "--batch-size", "8", "--hidden-dim", "16"]
TINY_RUN += ["--num-layers", "1", "--num-heads", "2", "--head-dim", "8", "--verbose", "0"]

WORDS = (
    "the cat dog sees a house river tree walks near big small old young red green blue stone bridge under over "
    "bird sings loud quiet night day sun moon rain snow wind field city road king queen garden apple window door "
    "mountain valley forest ocean island winter summer autumn spring morning evening story letter music painting"
).split()


def write_documents(folder, count, seed=0, lines=6):
    """`count` plain-text files of `lines` random sentences each in `folder`; returns their glob."""
    import numpy as np

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        text = [" ".join(rng.choice(WORDS, 7)) + " ." for _ in range(lines)]
        with open(os.path.join(folder, f"doc-{i:03d}.txt"), "w") as f:
            f.write("\n".join(text) + "\n")
    return os.path.join(str(folder), "*.txt")


# Characters NFKC leaves as they are, of each UTF-8 length past one byte: Cyrillic, CJK ideographs, emoji.
RARE_CHARACTERS = [chr(c) for c in [*range(0x0430, 0x0450), *range(0x4E00, 0x4F00), *range(0x1F600, 0x1F650)]]


def rare_character_lines(count, seed=0):
    """`count` lines of random words, each with three of 368 rare characters (`RARE_CHARACTERS`): more distinct
    characters than a vocabulary of 300 pieces holds."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, 6)) + " " + "".join(rng.choice(RARE_CHARACTERS, 3)) + " ." for _ in range(count)]


@pytest.fixture(scope="session")
def tiny_wikitext(tmp_path_factory):
    return write_tiny_wikitext(str(tmp_path_factory.mktemp("wikitext")))


@pytest.fixture(params=["branch", "select"])
def choice_form(request, monkeypatch):
    """Both ways `branch_or_select` makes a data-dependent choice: a CPU without XLA branches, while XLA and
    GPUs compute the general form alone. Here the second is taken on the CPU, eagerly."""
    if request.param == "select":
        import importlib

        from elita_tf import backend

        # The name the ops read, and the one the backend's own `branch_or_select` reads.
        monkeypatch.setattr(backend, "compiled_or_on_gpu", lambda: True)
        module = importlib.import_module(f"elita_tf.backend.{keras.backend.backend()}")
        monkeypatch.setattr(module, "compiled_or_on_gpu", lambda: True)
    return request.param
