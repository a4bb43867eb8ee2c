"""The model on each Keras backend (TensorFlow, JAX, PyTorch): `ElitaCausalLM` trains with the chunked loss and a
carried state, generates, saves a preset that loads on TensorFlow with the same logits, and trains LoRA adapters,
merges them and quantizes to int8.

TensorFlow's own, deeper model tests are in test_elita_causal_lm.py and test_generate.py; these run the same
contract on whichever backend the tests run on (`KERAS_BACKEND`).
"""

import importlib.util

import keras
import numpy as np
import pytest

from elita_tf.models import ARCHITECTURES, ElitaBackbone, ElitaCausalLM
from tests.backend_utils import BACKEND, numpy, run_on_backend
from tests.models.training import rule_batches, trainable



@pytest.fixture(autouse=True)
def as_users_run_jax():
    """JAX without the x64 mode the op and layer tests turn on (tests/conftest.py): keras-hub's samplers mix a
    Python 0 into int32 indices, which x64 mode makes int64."""
    if BACKEND != "jax":
        yield
        return
    import jax

    with jax.enable_x64(False):
        yield


# The architectures that decode step by step (elita-reference's positions move with the length).
DECODING = sorted(name for name in ARCHITECTURES if name != "elita-reference")


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_fit_lowers_the_loss_and_moves_every_weight(name):
    causal_lm = trainable(name)
    assert causal_lm._chunked_loss_applies()
    start = [numpy(w).copy() for w in causal_lm.trainable_weights]
    losses = [float(causal_lm.train_on_batch(x, y)) for x, y in rule_batches(steps=12)]
    assert all(np.isfinite(losses))
    # fastformerLM's head divides tied logits of N(0, 0.02) embeddings by sqrt(d): it starts uniform and moves slowly.
    drop = 0.02 if name == "additive-reference" else 0.1
    assert np.mean(losses[-3:]) < losses[0] - drop, losses
    for weight, before in zip(causal_lm.trainable_weights, start):
        assert not np.array_equal(numpy(weight), before), f"{weight.path} did not move"


# The three heads: an untied `logits` layer, the tied embedding, and the tied embedding scaled by 1/sqrt(d).
@pytest.mark.parametrize("name", ["elita", "simplified-reference", "additive-reference"])
def test_the_chunked_loss_is_keras_loss_on_the_logits(name):
    # Plain SGD: the weights move by the gradients themselves (Adam would magnify round-off
    # in gradients that are zero in exact arithmetic, such as a softmax key bias's).
    chunked = trainable(name, optimizer=keras.optimizers.SGD(0.5))
    plain = trainable(name, optimizer=keras.optimizers.SGD(0.5))
    plain.set_weights(chunked.get_weights())
    plain.chunked_loss = False
    assert chunked._chunked_loss_applies() and not plain._chunked_loss_applies()
    weights = np.random.default_rng(3).uniform(size=(8, 32)).astype("float32")  # as a preprocessor's padding gives
    for x, y in rule_batches(steps=3):
        got, want = chunked.train_on_batch(x, y, sample_weight=weights), plain.train_on_batch(x, y, weights)
        np.testing.assert_allclose(got, want, rtol=1e-5)
    for got, want in zip(chunked.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    x, y = rule_batches(steps=1, seed=1)[0]
    np.testing.assert_allclose(chunked.evaluate(x, y, verbose=0), plain.evaluate(x, y, verbose=0), rtol=1e-5)


def test_evaluation_with_weights_is_the_mean_over_every_weighted_token():
    """Averaged over the weights (packed documents), batches weigh in by their weights' sum, not their rows."""
    causal_lm = trainable("elita")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
    causal_lm.compile(keras.optimizers.SGD(0.0), loss, weighted_metrics=None)
    (x1, y1), (x2, y2) = rule_batches(steps=2)
    x = {name: np.concatenate([x1[name], x2[name]]) for name in x1}
    y = np.concatenate([y1, y2])
    weights = np.random.default_rng(4).uniform(size=y.shape).astype("float32")
    weights[:8] *= 0.1  # the first batch weighs a tenth of the second
    evaluated = causal_lm.evaluate(x, y, sample_weight=weights, batch_size=8, verbose=0)
    losses = numpy(causal_lm.backbone.token_losses(causal_lm.backbone.hidden_states(x["token_ids"]), y))
    np.testing.assert_allclose(evaluated, (losses * weights).sum() / weights.sum(), rtol=1e-5)


def test_a_carried_state_continues_the_stream_and_is_saved():
    """Two segments with the state carried equal one pass over both; the state is saved with the model."""
    x, y = rule_batches(steps=1, length=16)[0]
    starts = np.zeros((8, 16), bool)
    starts[:, 0] = True
    causal_lm = trainable("elita", optimizer=keras.optimizers.SGD(0.0))
    causal_lm.enable_carried_state(8)
    halves = [
        ({name: value[:, part] for name, value in {**x, "document_starts": starts}.items()}, y[:, part])
        for part in (slice(0, 8), slice(8, 16))
    ]
    carried = [float(causal_lm.train_on_batch(*half)) for half in halves]
    whole = trainable("elita", optimizer=keras.optimizers.SGD(0.0))
    whole.backbone.set_weights(causal_lm.backbone.get_weights())
    losses = numpy(whole.backbone.token_losses(whole.backbone.hidden_states(x["token_ids"]), y))
    np.testing.assert_allclose(carried, [losses[:, :8].mean(), losses[:, 8:].mean()], rtol=1e-5)
    np.testing.assert_array_equal(numpy(causal_lm.carried_state["position"]), [16] * 8)
    restored = ElitaCausalLM.from_config(causal_lm.get_config())
    restored.set_weights(causal_lm.get_weights())
    for got, want in zip(keras.tree.flatten(restored.carried_state), keras.tree.flatten(causal_lm.carried_state)):
        np.testing.assert_array_equal(numpy(got), numpy(want))


# Keras on PyTorch infers a model's shapes (its first `fit` or `train_on_batch` builds the loss from them) with
# tensors on the "meta" device, which have no values. An op that reads one sends Keras to its fallback: a whole
# forward pass on real tensors of the batch's shape, the [B, T, V] logits among them (ELiTA's seed step held 1,314 MiB
# of tensors in its first step, 344 in the next, and the process kept the difference).
@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's meta device")
@pytest.mark.parametrize("name", [*sorted(ARCHITECTURES), "transformer-sliding-window"])
def test_every_architecture_infers_its_shapes_without_values_on_pytorch(name):
    import torch

    size = dict(vocabulary_size=24, num_layers=3, num_heads=2, hidden_dim=16, head_dim=8, max_sequence_length=32)
    if name == "transformer-sliding-window":
        backbone = ElitaBackbone.from_architecture("transformer", sliding_window_sizes=[4, None, 4], **size)
    else:
        backbone = ElitaBackbone.from_architecture(name, **size)
    inputs = {"token_ids": torch.zeros((2, 32), dtype=torch.int32), "padding_mask": torch.ones((2, 32), dtype=torch.bool)}
    with keras.device("meta"), torch.no_grad():
        logits = backbone(inputs)
    assert logits.device.type == "meta" and tuple(logits.shape) == (2, 32, 24)


@pytest.mark.parametrize("name", DECODING)
def test_greedy_generate_is_the_argmax_of_the_parallel_forward(name):
    causal_lm = trainable(name)
    causal_lm.compile(sampler="greedy")
    lengths, width = [4, 2], 10
    prompts = {"token_ids": np.zeros((2, width), "int32"), "padding_mask": np.zeros((2, width), "int32")}
    rng = np.random.default_rng(1)
    for row, length in enumerate(lengths):
        prompts["token_ids"][row, :length] = rng.integers(3, 24, size=length)
        prompts["padding_mask"][row, :length] = 1
    generated = numpy(causal_lm.generate(prompts, stop_token_ids=None)["token_ids"])
    for row, length in zip(generated, lengths):
        logits = numpy(causal_lm.backbone({"token_ids": row[None], "padding_mask": np.ones((1, width), "int32")}))[0]
        np.testing.assert_array_equal(row[length:], np.argmax(logits[length - 1 : -1], axis=-1))


@pytest.mark.parametrize("bad", [24, -1])
def test_a_prompt_id_outside_the_vocabulary_is_refused_before_decoding(bad):
    # Inside the compiled step (`jax.jit`) the embedding's NaN would become token 0 through the argmax.
    causal_lm = trainable("elita")
    causal_lm.compile(sampler="greedy")
    prompts = {"token_ids": np.array([[1, 2, bad, 3, 0, 0]], "int32"), "padding_mask": np.array([[1, 1, 1, 1, 0, 0]])}
    with pytest.raises(ValueError, match=rf"Token ids must be in \[0, vocabulary_size=24\)\. Received: token_ids\[0, 2\]={bad}$"):
        causal_lm.generate(prompts, stop_token_ids=None)


def test_scores_are_plain_values_that_numpy_reads():
    # On PyTorch a score that required grad would keep its autograd graph, and `np.asarray` would refuse it.
    causal_lm = trainable("elita")
    ids = np.array([[1, 5, 9, 3]], "int32")
    for scores in (causal_lm.score(ids), causal_lm.score(ids, scoring_mode="loss", target_ids=np.roll(ids, -1))):
        assert np.isfinite(np.asarray(scores)).all()
        assert not getattr(scores, "requires_grad", False)


_LOAD_ON_TENSORFLOW = """
import sys, numpy as np, keras
from elita_tf.models import ElitaCausalLM
directory, names = sys.argv[1], sys.argv[2:]
x = dict(np.load(f"{directory}/inputs.npz"))
np.savez(f"{directory}/logits.npz", **{
    name: keras.ops.convert_to_numpy(ElitaCausalLM.from_preset(f"{directory}/{name}")(x)) for name in names
})
"""


@pytest.mark.skipif(BACKEND == "tensorflow", reason="a preset saved on TensorFlow loads there (test_elita_causal_lm)")
def test_presets_saved_here_load_on_tensorflow_with_the_same_logits(tmp_path):
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed")
    x, _ = rule_batches(steps=1)[0]
    np.savez(tmp_path / "inputs.npz", **x)
    want = {}
    rng = np.random.default_rng(0)
    for name in sorted(ARCHITECTURES):
        causal_lm = trainable(name)
        # Weights away from their start (a step's worth of noise: an initializer's seed cannot pass for them).
        weights = causal_lm.get_weights()
        noise = [rng.normal(0, 0.01, w.shape) if w.dtype.kind == "f" else 0 for w in weights]
        causal_lm.set_weights([(w + n).astype(w.dtype) for w, n in zip(weights, noise)])
        causal_lm.save_to_preset(str(tmp_path / name))
        want[name] = numpy(causal_lm(x))
    run_on_backend("tensorflow", _LOAD_ON_TENSORFLOW, tmp_path, *want)
    got = np.load(tmp_path / "logits.npz")
    for name, logits in want.items():
        np.testing.assert_allclose(got[name], logits, rtol=1e-5, atol=1e-5 * np.abs(logits).max(), err_msg=name)



@pytest.mark.parametrize("name", ["elita", "transformer", "3lin"])
def test_lora_trains_only_its_adapters_and_merges_and_int8_stays_close(name, tmp_path):
    x, y = rule_batches(steps=1)[0]
    causal_lm = trainable(name)
    want = numpy(causal_lm(x))
    causal_lm.backbone.enable_lora(4)
    np.testing.assert_allclose(numpy(causal_lm(x)), want, rtol=1e-5, atol=1e-5)  # B starts at zero
    frozen = [numpy(w).copy() for w in causal_lm.backbone.non_trainable_weights]
    adapters = {w.path: numpy(w).copy() for w in causal_lm.trainable_weights if "lora_kernel" in w.path}
    assert adapters
    causal_lm.compile(optimizer=keras.optimizers.Adam(1e-2), loss=causal_lm.loss, weighted_metrics=None)
    for _ in range(3):
        causal_lm.train_on_batch(x, y)
    for weight, before in zip(causal_lm.backbone.non_trainable_weights, frozen):
        np.testing.assert_array_equal(numpy(weight), before, err_msg=weight.path)
    assert any(not np.array_equal(numpy(w), adapters[w.path]) for w in causal_lm.trainable_weights if w.path in adapters)
    adapted = numpy(causal_lm(x))
    assert not np.allclose(adapted, want, rtol=1e-3, atol=1e-3)
    merged = causal_lm.backbone.merge_lora()
    assert merged.lora_rank is None
    np.testing.assert_allclose(numpy(merged(x)), adapted, rtol=1e-4, atol=1e-4 * np.abs(adapted).max())

    merged.quantize("int8")
    assert any(w.dtype == "int8" for w in merged.weights)
    got = numpy(merged(x))
    # int8 weights (and, on TensorFlow, int8 activations): 5.6% of the largest logit at most, measured.
    assert np.abs(got - adapted).max() < 0.1 * np.abs(adapted).max() and not np.array_equal(got, adapted)
    merged.save_to_preset(str(tmp_path / "int8"))
    reloaded = ElitaCausalLM(ElitaBackbone.from_preset(str(tmp_path / "int8")))
    np.testing.assert_allclose(numpy(reloaded.backbone(x)), got, rtol=1e-6, atol=1e-6)
    reloaded.compile(sampler="greedy")
    prompts = {"token_ids": np.full((1, 8), 3, "int32"), "padding_mask": np.array([[1, 1, 0, 0, 0, 0, 0, 0]], "int32")}
    assert numpy(reloaded.generate(prompts, stop_token_ids=None)["token_ids"]).shape == (1, 8)
