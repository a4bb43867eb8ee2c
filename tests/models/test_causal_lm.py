import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from elita_tf.data.tokenizer import train_sentencepiece
from elita_tf.models import (
    PRESETS,
    ElitaBackbone,
    ElitaCausalLM,
    ElitaCausalLMPreprocessor,
    ElitaTokenizer,
)

SIZE = {"num_layers": 2, "hidden_dim": 16, "num_heads": 2, "head_dim": 8, "max_sequence_length": 32}
LINES = [f"the cat number {i} sees a dog and a house ." for i in range(300)]


@pytest.fixture(scope="module")
def proto():
    return train_sentencepiece(LINES, vocab_size=40)


def _backbone(name, **overrides):
    keras.utils.set_random_seed(0)
    backbone = ElitaBackbone.from_architecture(name, vocabulary_size=40, **{**SIZE, **overrides})
    rng = np.random.default_rng(0)
    for w in backbone.weights:  # zero-initialised parts (3Lin Combiner, pooling vectors) made non-trivial
        if np.all(w.numpy() == 0) and len(w.shape) > 0 and "bias" not in w.path and "beta" not in w.path:
            w.assign(rng.normal(size=w.shape) * 0.3)
    return backbone


def _greedy(backbone, jit_compile=False):
    causal_lm = ElitaCausalLM(backbone)
    causal_lm.compile(sampler="greedy", jit_compile=jit_compile)
    return causal_lm


def _assert_greedy_is_the_parallel_argmax(backbone, token_ids, lengths):
    """Each generated token is the argmax of the parallel forward over the row's own sequence so far."""
    for row, length in zip(token_ids, lengths):
        logits = backbone({"token_ids": row[None], "padding_mask": np.ones((1, len(row)), "int32")})[0]
        np.testing.assert_array_equal(row[length:], np.argmax(logits[length - 1 : -1], axis=-1))


def _prompts(lengths, width):
    rng = np.random.default_rng(1)
    token_ids = np.zeros((len(lengths), width), "int32")
    padding_mask = np.zeros((len(lengths), width), "int32")
    for i, length in enumerate(lengths):
        token_ids[i, :length] = rng.integers(3, 40, size=length)
        padding_mask[i, :length] = 1
    return {"token_ids": token_ids, "padding_mask": padding_mask}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_greedy_generate_is_the_parallel_argmax_for_prompts_of_different_lengths(name):
    backbone = _backbone(name)
    lengths = [7, 2, 1, 5]
    out = _greedy(backbone).generate(_prompts(lengths, 24), stop_token_ids=None)
    assert out["token_ids"].shape == (4, 24) and np.all(out["padding_mask"])
    _assert_greedy_is_the_parallel_argmax(backbone, out["token_ids"], lengths)


@pytest.mark.parametrize("name", ["elita", "3lin", "transformer"])
def test_generate_compiles_with_xla(name):
    backbone = _backbone(name)
    prompts = _prompts([6, 3], 20)
    compiled = _greedy(backbone, jit_compile=True).generate(prompts, stop_token_ids=None)
    np.testing.assert_array_equal(
        compiled["token_ids"], _greedy(backbone).generate(prompts, stop_token_ids=None)["token_ids"]
    )


@pytest.mark.parametrize("name", ["elita", "linear", "additive"])
def test_recurrent_state_blocks_decode_to_four_times_the_training_length(name):
    # Linear and additive blocks carry constant-size states; their presets' learned position tables are left out.
    backbone = _backbone(name, position_embedding=False)
    assert backbone.decoder_config.decode_limit is None
    lengths = [9, 4]
    out = _greedy(backbone).generate(_prompts(lengths, 4 * SIZE["max_sequence_length"]), stop_token_ids=None)
    _assert_greedy_is_the_parallel_argmax(backbone, out["token_ids"], lengths)


def test_a_finite_buffer_refuses_a_longer_generation_by_name():
    with pytest.raises(ValueError, match=r"`max_length` 40 exceeds the 32 positions.*Received: max_length=40"):
        _greedy(_backbone("transformer")).generate(_prompts([3], 40), stop_token_ids=None)


def test_text_in_text_out_fit_and_preset_round_trip(proto, tmp_path):
    backbone = _backbone("elita")
    # After the seed: `tf.random.set_seed` drops the SentencePiece resource of a tokenizer made before it.
    tokenizer = ElitaTokenizer(proto=proto)
    preprocessor = ElitaCausalLMPreprocessor(tokenizer, sequence_length=24)
    causal_lm = ElitaCausalLM(backbone, preprocessor)
    causal_lm.compile(sampler="greedy")
    history = causal_lm.fit(LINES[:32], batch_size=8, epochs=2, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    # The start token is the end-of-line piece: a prompt is a new line of the training text.
    x, y, weights = preprocessor(["the cat"])
    assert int(x["token_ids"][0, 0]) == tokenizer.end_token_id == tokenizer.start_token_id
    logits = causal_lm(x)
    assert logits.shape == (1, 24, 40) and logits.dtype == "float32"

    text = causal_lm.generate(["the cat", "a dog sees"], max_length=20)
    assert [t[: len(p)] for t, p in zip(text, ["the cat", "a dog sees"])] == ["the cat", "a dog sees"]

    causal_lm.save_to_preset(str(tmp_path))
    assert isinstance(keras_hub.models.Backbone.from_preset(str(tmp_path)), ElitaBackbone)
    loaded = ElitaCausalLM.from_preset(str(tmp_path))
    loaded.compile(sampler="greedy")
    assert loaded.generate(["the cat", "a dog sees"], max_length=20) == text
    np.testing.assert_allclose(loaded(x), causal_lm(x), rtol=1e-6, atol=1e-6)


def test_stop_tokens_end_each_row():
    causal_lm = ElitaCausalLM(_backbone("linear"))
    causal_lm.compile(sampler="greedy")
    prompts = _prompts([3, 2], 16)
    full = causal_lm.generate(prompts, stop_token_ids=None)["token_ids"]
    stop = int(full[0, 4])  # the second new token of row 0
    out = causal_lm.generate(prompts, stop_token_ids=[stop])
    first_stop = 3 + list(full[0, 3:]).index(stop)
    assert list(out["padding_mask"][0]) == [True] * (first_stop + 1) + [False] * (16 - first_stop - 1)


def test_bad_arguments_get_keras_style_errors():
    with pytest.raises(ValueError, match=r"Unknown architecture.*Received: name='gpt'"):
        ElitaBackbone.from_architecture("gpt", vocabulary_size=40)
    with pytest.raises(ValueError, match=r"`width` must be a positive integer. Received: width=0"):
        ElitaBackbone(vocabulary_size=40, hidden_dim=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="padding_mask has a row with none"):
        _greedy(_backbone("elita")).generate(_prompts([3, 0], 8), stop_token_ids=None)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_int8_and_lora_cover_every_projection(name):
    backbone = _backbone(name)
    x = _prompts([8], 8)
    want = backbone(x)
    matrices = {w.path for w in backbone.weights if len(w.shape) >= 2}
    lora = _backbone(name)
    lora.enable_lora(4)
    adapted = {w.path.rsplit("/", 1)[0] for w in lora.trainable_weights if "lora_kernel" in w.path}
    # Every block's projections get adapters; only they (and, as Keras does, their biases) train.
    assert {w.path.rsplit("/", 1)[0] for w in lora.trainable_weights} == adapted
    assert all(w.path.rsplit("/", 1)[-1] in ("lora_kernel_a", "lora_kernel_b", "bias") for w in lora.trainable_weights)
    projections = {p.rsplit("/", 1)[0] for p in matrices if p.endswith("kernel") and not p.startswith("logits")}
    assert adapted == projections
    np.testing.assert_allclose(lora(x), want, rtol=1e-6, atol=1e-6)  # B starts at zero: the same function

    backbone.quantize("int8")
    int8 = {w.path.rsplit("/", 1)[0] for w in backbone.weights if w.dtype == "int8"}
    head = set() if backbone.decoder_config.tied_embeddings else {"logits"}  # a tied head is the embedding
    assert projections | head <= int8
    got = backbone(x)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()  # close, and not the float model
    assert not np.array_equal(got, want)
    # Generation runs on the quantized model too.
    out = _greedy(backbone).generate(_prompts([4, 2], 10), stop_token_ids=None)
    assert out["token_ids"].shape == (2, 10)


def test_position_scale_is_apart_from_the_buffers():
    short = _backbone("elita")
    long = _backbone(
        "elita", max_sequence_length=4 * SIZE["max_sequence_length"], position_scale=SIZE["max_sequence_length"]
    )
    long.set_weights(short.get_weights())
    x = _prompts([20], 20)
    np.testing.assert_allclose(long(x), short(x), rtol=1e-6, atol=1e-6)
    assert ElitaBackbone.from_config(long.get_config()).decoder_config.position_scale == SIZE["max_sequence_length"]
    with pytest.raises(
        ValueError, match=r"`position_scale` must be None or an integer >= 2. Received: position_scale=1"
    ):
        ElitaBackbone(vocabulary_size=40, position_scale=1)
    clamped = _backbone("elita", position_mode="clamped")
    assert ElitaBackbone.from_config(clamped.get_config()).get_layer("block_0").mixer.position_mode == "clamped"
    with pytest.raises(ValueError, match=r"`position_mode` must be one of \('fixed', 'clamped'\)"):
        ElitaBackbone(vocabulary_size=40, position_mode="length")
