import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from elita_tf.generation import Generator
from elita_tf.models import PRESETS, DecoderConfig, build_decoder, preset
from elita_tf.schedules import InverseSqrtSchedule, elita_adam

SMALL = {"width": 32, "num_layers": 2, "num_heads": 2, "head_dim": 8, "context_length": 32}


def _rule_batches(vocab=24, length=32, batch=8, steps=20, seed=0):
    """Sequences of `next = (5 * token + 1) mod V` from random starts: learnable in a few steps."""
    tokens = np.random.default_rng(seed).integers(0, vocab, size=(steps, batch, 1))
    columns = [tokens]
    for _ in range(length):
        columns.append((5 * columns[-1] + 1) % vocab)
    seqs = np.concatenate(columns, axis=-1)
    return [(s[:, :-1], s[:, 1:]) for s in seqs]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_trains_20_steps(name):
    keras.utils.set_random_seed(0)
    model = build_decoder(preset(name, vocab_size=24, **SMALL))
    model.compile(elita_adam(), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    losses = [float(model.train_on_batch(x, y)) for x, y in _rule_batches()]
    assert all(np.isfinite(losses))
    # fastformerLM's head divides tied logits of N(0, 0.02) embeddings by sqrt(d): it starts
    # uniform and moves slowly at this learning rate (measured: 3.18 -> 3.08 in 20 steps).
    drop = 0.05 if name == "additive-reference" else 0.3
    assert np.mean(losses[-5:]) < losses[0] - drop, losses


def _keras_and_chunked_models(name):
    """Two copies of one model: compiled as `elita-train` does, with the chunked head and with Keras' step."""
    config = preset(name, vocab_size=24, **SMALL)
    keras.utils.set_random_seed(0)
    chunked, plain = build_decoder(config), build_decoder(config)
    plain.set_weights(chunked.get_weights())
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # Plain SGD: the weights move by the gradients themselves (Adam would magnify round-off
    # in gradients that are zero in exact arithmetic, such as a softmax key bias's).
    chunked.compile(keras.optimizers.SGD(0.5), loss)
    plain.compile(keras.optimizers.SGD(0.5), loss)
    plain.chunked_head = False
    assert chunked._chunked_head_applies(None) and not plain._chunked_head_applies(None)
    return chunked, plain


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_chunked_head_trains_and_evaluates_as_keras_loss_on_the_logits(name):
    chunked, plain = _keras_and_chunked_models(name)
    for x, y in _rule_batches(steps=3):
        got, want = chunked.train_on_batch(x, y), plain.train_on_batch(x, y)
        np.testing.assert_allclose(got, want, rtol=1e-5)
    for got, want in zip(chunked.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    x, y = _rule_batches(steps=1, seed=1)[0]
    np.testing.assert_allclose(chunked.evaluate(x, y, verbose=0), plain.evaluate(x, y, verbose=0), rtol=1e-5)


def test_chunked_head_survives_a_checkpoint_and_refuses_float_ids(tmp_path):
    chunked, _ = _keras_and_chunked_models("elita")
    path = str(tmp_path / "model.keras")
    chunked.save(path)
    restored = keras.models.load_model(path)
    assert restored._chunked_head_applies(None)
    assert restored.decoder_config == chunked.decoder_config
    restored.compile(
        keras.optimizers.SGD(0.5), keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    assert not restored._chunked_head_applies(None)  # a metric needs the logits
    restored = keras.models.load_model(path)
    x, y = _rule_batches(steps=1)[0]
    np.testing.assert_allclose(restored.train_on_batch(x, y), chunked.train_on_batch(x, y), rtol=1e-6)
    with pytest.raises(TypeError, match="float32"):
        restored.train_on_batch(x.astype("float32"), y)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_causal_and_round_trips_keras(name, tmp_path):
    model = build_decoder(preset(name, vocab_size=24, **SMALL))
    ids = np.random.default_rng(1).integers(0, 24, size=(2, 20))
    logits = model(ids)
    assert logits.shape == (2, 20, 24) and logits.dtype == tf.float32
    changed = ids.copy()
    changed[:, 12:] = (changed[:, 12:] + 1) % 24
    np.testing.assert_allclose(model(changed)[:, :12], logits[:, :12], rtol=1e-5, atol=1e-5)
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    np.testing.assert_allclose(keras.models.load_model(path)(ids), logits, rtol=1e-6, atol=1e-6)


def test_mixed_blocks_and_wide_ffn_is_shared():
    config = DecoderConfig(
        vocab_size=24,
        blocks=("elita", "transformer", "additive", "simplified"),
        ffn="wide",
        **{k: v for k, v in SMALL.items() if k != "num_layers"},
        num_layers=4,
    )
    model = build_decoder(config)
    ffns = {id(model.get_layer(f"block_{i}").ffn) for i in range(4)}
    wide = model.get_layer("block_0").ffn
    assert len(ffns) == 1 and wide.name == "wide_ffn" and wide.inner.kernel.shape == (32, 4 * 32 * 4)
    assert model(np.zeros((1, 5), int)).shape == (1, 5, 24)


def test_reference_presets_build_the_originals_wrappers():
    model = build_decoder(preset("additive-reference", vocab_size=24, **SMALL))
    names = [layer.name for layer in model.layers]
    assert "embedding_norm" in names and "final_norm" not in names and "logits" not in names
    block = model.get_layer("block_0")
    assert block.mixer_norm.epsilon == block.ffn_norm.epsilon == 1e-5
    assert not block.ffn.inner.use_bias and block.ffn.inner.kernel_initializer.stddev == 0.02
    # Tied logits over sqrt(width), after no final norm.
    ids = np.random.default_rng(2).integers(0, 24, size=(1, 7))
    hidden = keras.Model(model.input, model.get_layer("block_1").output)(ids)
    embeddings = model.get_layer("embedding").embeddings
    np.testing.assert_allclose(model(ids), hidden @ tf.transpose(embeddings) / np.sqrt(32), rtol=1e-5, atol=1e-5)
    simplified = build_decoder(preset("simplified-reference", vocab_size=24, **SMALL))
    first, second = (simplified.get_layer(f"block_{i}").mixer for i in range(2))
    assert first.value_projection and not second.value_projection
    assert "logits" not in [layer.name for layer in simplified.layers]
    with pytest.raises(ValueError, match="set `tied_embeddings=True` too"):
        preset("additive", vocab_size=24, scaled_tied_logits=True)
    with pytest.raises(ValueError, match="norm_epsilon=0"):
        preset("additive", vocab_size=24, norm_epsilon=0)


def test_config_round_trip_and_errors():
    config = preset("additive", vocab_size=100, windows=(2, 4, None), num_layers=3, dropout=0.1, tied_embeddings=True)
    assert DecoderConfig.from_json(config.to_json()) == config
    assert json.loads(config.to_json())["blocks"] == ["additive"] * 3
    with pytest.raises(ValueError, match="Unknown preset"):
        preset("gpt5", vocab_size=10)
    with pytest.raises(ValueError, match="context_length"):
        DecoderConfig(vocab_size=10, context_length=1)
    with pytest.raises(ValueError, match="one block type per layer"):
        DecoderConfig(vocab_size=10, num_layers=3, blocks=("elita", "linear"))
    with pytest.raises(ValueError, match="Unknown block type"):
        DecoderConfig(vocab_size=10, blocks="lstm")


def test_tied_embeddings_share_the_matrix():
    model = build_decoder(preset("elita", vocab_size=24, tied_embeddings=True, **SMALL))
    assert not any(layer.name == "logits" for layer in model.layers)
    assert model(np.zeros((1, 3), int)).shape == (1, 3, 24)


def test_token_ids_must_be_integers_in_range_and_positions_bounded():
    model = build_decoder(preset("transformer", vocab_size=24, **SMALL))
    with pytest.raises(Exception, match="max_length=32"):
        model(np.zeros((1, 40), int))
    # Eagerly: Keras' `take` wrapped -3 to the last rows; the int32 Input truncated 1.5 to 1.
    with pytest.raises(ValueError, match=r"vocabulary_size=24\). Received: token_ids\[0, 1\]=-3"):
        model(np.array([[1, -3, 2]]))
    with pytest.raises(ValueError, match=r"Received: token_ids\[1, 0\]=24"):
        model(np.array([[1, 2], [24, 3]]))
    with pytest.raises(TypeError, match="float ids are refused.*float64"):
        model(np.array([[1.5, 2.0, 3.0]]))
    with pytest.raises(TypeError, match="float ids are refused.*float32"):
        model.predict(np.array([[1.0, 2.0]], "float32"), verbose=0)
    # In a graph (predict, fit, a SavedModel): the step fails naming the ids and their positions.
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"vocabulary_size=24.*\[30\] \[at\] \[\[0 2\]\]"):
        model.predict(np.array([[1, 2, 30]]), verbose=0)


def test_out_of_range_ids_under_xla_give_nan_not_a_clamped_row():
    # XLA drops assertions and clamps gathers: the embedding marks the row NaN instead.
    keras.utils.set_random_seed(0)
    model = build_decoder(preset("elita", vocab_size=24, **SMALL))
    model.compile(elita_adam(), keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    x, y = np.array([[1, 2, 3, 4]] * 2), np.array([[2, 3, 4, 5]] * 2)
    assert np.isfinite(model.train_on_batch(x, y))
    x[1, 2] = 99
    assert np.isnan(model.train_on_batch(x, y))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_trains_and_generates_under_xla(name):
    # Keras compiles with XLA by default on GPUs: the training step and the decoding loop must compile.
    keras.utils.set_random_seed(0)
    config = preset(name, vocab_size=24, **SMALL)
    model = build_decoder(config)
    model.compile(elita_adam(), keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    losses = [float(model.train_on_batch(x, y)) for x, y in _rule_batches(steps=3)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    prompts = [[1, 2, 3], [4]]
    compiled = Generator(model, config, jit_compile=True)(prompts, 6)
    np.testing.assert_array_equal(compiled, Generator(model, config)(prompts, 6))


@pytest.mark.parametrize("policy_name", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_fits_under_mixed_precision(name, policy_name, policy):
    policy(policy_name)
    keras.utils.set_random_seed(0)
    model = build_decoder(preset(name, vocab_size=24, **SMALL))
    model.compile(elita_adam(), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    losses = [float(model.train_on_batch(x, y)) for x, y in _rule_batches(steps=3)]
    assert all(np.isfinite(losses)), losses
    assert all(w.dtype == "float32" for w in model.weights)


def test_inverse_sqrt_schedule():
    schedule = InverseSqrtSchedule()
    lr = [float(schedule(step)) for step in [0, 99, 100, 399, 9999]]
    np.testing.assert_allclose(lr, [1e-3, 1e-3, 1e-2 / np.sqrt(101), 5e-4, 1e-4], rtol=1e-6)
    assert InverseSqrtSchedule.from_config(schedule.get_config()).get_config() == {"peak": 1e-3, "scale": 1e-2}
    optimizer = elita_adam()
    assert (optimizer.beta_1, optimizer.beta_2) == (0.9, 0.99)
