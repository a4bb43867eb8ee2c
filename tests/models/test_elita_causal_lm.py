import json
import shutil
import warnings

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from elita_tf.data.tokenizer import train_sentencepiece
from elita_tf.models import (
    ARCHITECTURES,
    ElitaBackbone,
    ElitaCausalLM,
    ElitaCausalLMPreprocessor,
    ElitaTokenizer,
)
from elita_tf.schedules import InverseSqrtSchedule, elita_adam
from tests.conftest import DESIGNS
from tests.models.training import rule_batches, trainable

# The architectures that decode step by step (elita-reference's positions move with the length).
DECODING = sorted(name for name in ARCHITECTURES if name != "elita-reference")

SIZE = {"num_layers": 2, "hidden_dim": 16, "num_heads": 2, "head_dim": 8, "max_sequence_length": 32}
LINES = [f"the cat number {i} sees a dog and a house ." for i in range(300)]


@pytest.fixture(scope="module")
def proto():
    return train_sentencepiece(LINES, vocabulary_size=40)


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


def _prompts(lengths, width, vocabulary_size=40):
    rng = np.random.default_rng(1)
    token_ids = np.zeros((len(lengths), width), "int32")
    padding_mask = np.zeros((len(lengths), width), "int32")
    for i, length in enumerate(lengths):
        token_ids[i, :length] = rng.integers(3, vocabulary_size, size=length)
        padding_mask[i, :length] = 1
    return {"token_ids": token_ids, "padding_mask": padding_mask}


@pytest.mark.parametrize("name", DECODING)
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
    # Linear and additive blocks carry constant-size states; their recipes' learned position tables are left out.
    backbone = _backbone(name, position_embedding=False)
    assert backbone.decode_limit is None
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

    # Text scores as a line of training text: end-of-line, its pieces, end-of-line; padding scores 0.
    texts = ["the cat number 7 sees a dog", "a house ."]
    losses = causal_lm.score(texts, scoring_mode="loss").numpy()
    for row, line in enumerate(texts):
        pieces = [tokenizer.start_token_id] + np.asarray(tokenizer(line)).tolist() + [tokenizer.end_token_id]
        ids = np.array([pieces[:-1]], "int32")
        alone = causal_lm.score(ids, scoring_mode="loss", target_ids=np.array([pieces[1:]], "int32")).numpy()[0]
        np.testing.assert_allclose(losses[row, : len(alone)], alone, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(losses[row, len(alone) :], 0.0)
    one = causal_lm.score("a house .", scoring_mode="loss").numpy()[0]  # alone: no padding
    np.testing.assert_allclose(one, losses[1, : len(one)], rtol=1e-5, atol=1e-6)
    assert len(one) < losses.shape[1]
    assert causal_lm.score(texts).shape == (2, losses.shape[1], 40)
    with pytest.raises(ValueError, match="leave `padding_mask` and `target_ids` out"):
        causal_lm.score(texts, target_ids=np.zeros((2, 3), "int32"))
    with pytest.raises(ValueError, match="this model reads at most 32 positions"):
        ElitaCausalLM(_backbone("transformer"), preprocessor).score(" ".join(LINES[:3]))
    with pytest.raises(ValueError, match="Scoring text needs a preprocessor"):
        ElitaCausalLM(backbone).score("the cat")

    causal_lm.save_to_preset(str(tmp_path))
    assert isinstance(keras_hub.models.Backbone.from_preset(str(tmp_path)), ElitaBackbone)
    loaded = ElitaCausalLM.from_preset(str(tmp_path))
    loaded.compile(sampler="greedy")
    assert loaded.generate(["the cat", "a dog sees"], max_length=20) == text
    np.testing.assert_allclose(loaded(x), causal_lm(x), rtol=1e-6, atol=1e-6)


def test_from_preset_names_what_is_wrong(proto, tmp_path):
    causal_lm = ElitaCausalLM(_backbone("elita"), ElitaCausalLMPreprocessor(ElitaTokenizer(proto=proto), 24))
    good = tmp_path / "good"
    causal_lm.save_to_preset(str(good))
    with pytest.raises(ValueError, match="no built-in presets. Received: preset='gemma_2b_en'"):
        ElitaCausalLM.from_preset("gemma_2b_en")  # a keras-hub handle: not fetched from Kaggle
    # from_preset knows presets only, as keras-hub's does: any other directory is refused, named.
    (tmp_path / "other").mkdir()
    with pytest.raises(FileNotFoundError, match=r"'.*other' has no config.json: it is not a keras-hub preset"):
        ElitaBackbone.from_preset(str(tmp_path / "other"))

    def damaged(name, cut):
        broken = tmp_path / f"broken-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(good, broken)
        data = (broken / name).read_bytes()
        (broken / name).write_bytes(data[: len(data) // 2] if cut else b"")
        if not cut:
            (broken / name).unlink()
        return str(broken)

    with pytest.raises(FileNotFoundError, match="has no model.weights.h5"):
        ElitaCausalLM.from_preset(damaged("model.weights.h5", cut=False))
    assert ElitaBackbone.from_preset(damaged("model.weights.h5", cut=False), load_weights=False).num_layers == 2
    with pytest.raises(ValueError, match="model.weights.h5 cannot be read .*truncated"):
        ElitaCausalLM.from_preset(damaged("model.weights.h5", cut=True))
    with pytest.raises(ValueError, match="vocabulary.spm cannot be read"):
        ElitaCausalLM.from_preset(damaged("assets/tokenizer/vocabulary.spm", cut=True))


@pytest.mark.parametrize("name", ["elita", "transformer"])
def test_score_gives_keras_hub_s_logits_losses_and_intercepts(name):
    causal_lm = ElitaCausalLM(_backbone(name))
    x = _prompts([8, 5], 8)
    ids, mask = tf.constant(x["token_ids"]), tf.constant(x["padding_mask"])
    targets = tf.roll(ids, -1, axis=1)
    logits = causal_lm.backbone(x)
    np.testing.assert_allclose(causal_lm.score(ids, mask), logits, rtol=1e-6, atol=1e-6)
    losses = causal_lm.score(ids, mask, scoring_mode="loss", target_ids=targets)
    want = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(targets, logits)
    np.testing.assert_allclose(losses, want, rtol=1e-5, atol=1e-6)
    # The intercept sees the embeddings (-1) and every block's output, and what it returns is used.
    seen = []

    def intercept(h, i):
        seen.append(i)
        return h * 0.0 if i == -1 else h

    zeroed = causal_lm.score(ids, mask, layer_intercept_fn=intercept)
    assert seen == [-1, 0, 1]
    assert not np.allclose(zeroed, logits)
    np.testing.assert_allclose(zeroed[0], zeroed[0, :1].numpy().repeat(8, 0), rtol=1e-5, atol=1e-5)  # no tokens seen
    # Gradients of the losses with respect to the embeddings, as keras-hub's example takes them.
    with tf.GradientTape() as tape:
        embedded = []

        def watch(h, i):
            if i == -1:
                tape.watch(h)
                embedded.append(h)
            return h

        total = tf.reduce_sum(causal_lm.score(ids, mask, "loss", watch, targets))
    assert np.abs(tape.gradient(total, embedded[0])).max() > 0
    with pytest.raises(ValueError, match="Received: scoring_mode='perplexity'"):
        causal_lm.score(ids, scoring_mode="perplexity")
    with pytest.raises(ValueError, match="needs `target_ids`"):
        causal_lm.score(ids, scoring_mode="loss")


def test_generate_refuses_what_it_cannot_do_by_name(proto):
    causal_lm = ElitaCausalLM(_backbone("elita"), ElitaCausalLMPreprocessor(ElitaTokenizer(proto=proto), 24))
    causal_lm.compile(sampler="greedy")
    with pytest.raises(ValueError, match=r"no prompts.*Received: inputs=\[\]"):
        causal_lm.generate([])
    for bad in (0, -5, 2.5):
        with pytest.raises(ValueError, match=rf"`max_length` must be a positive integer. Received: max_length={bad}"):
            causal_lm.generate("the cat", max_length=bad)
    with pytest.raises(ValueError, match=r"leaves no room for a new token. Received: max_length=3"):
        causal_lm.generate("the cat sees a dog", max_length=3)
    # Bytes are text: the same continuation as the string.
    assert causal_lm.generate(b"the cat", max_length=12) == causal_lm.generate("the cat", max_length=12)
    with pytest.raises(
        ValueError, match=r"`sampler` must be a keras_hub.samplers.Sampler.*Received: sampler='nonexistent'"
    ):
        causal_lm.compile(sampler="nonexistent")


def test_a_prompt_character_outside_the_vocabulary_is_named_in_a_warning(proto):
    causal_lm = ElitaCausalLM(_backbone("elita"), ElitaCausalLMPreprocessor(ElitaTokenizer(proto=proto), 24))
    causal_lm.compile(sampler="greedy")
    # The corpus is lower case: a capital has no piece, and becomes <unk> (" ⁇ ").
    with pytest.warns(UserWarning, match=r"characters 'T', 'Q' are not in the tokenizer's vocabulary.*--byte-fallback"):
        causal_lm.generate(["The cat", "a Qa dog"], max_length=12)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        causal_lm.generate(["the cat", "a dog"], max_length=12)


def test_a_byte_fallback_tokenizer_spells_a_new_character_in_bytes():
    proto = train_sentencepiece(LINES, vocabulary_size=300, byte_fallback=True)
    tokenizer = ElitaTokenizer(proto=proto)
    assert tokenizer.unknown_characters(["The Quiet cat ж 𝄞"]) == []
    assert tokenizer.detokenize(tokenizer(["The Quiet cat ж 𝄞"])) == ["The Quiet cat ж 𝄞"]
    assert ElitaTokenizer(proto=train_sentencepiece(LINES, vocabulary_size=40)).unknown_characters(["Tж a"]) == [
        "T",
        "ж",
    ]
    with pytest.raises(ValueError, match=r"at least 261 with byte fallback.*Received: vocabulary_size=260$"):
        train_sentencepiece(LINES, vocabulary_size=260, byte_fallback=True)


def test_a_prompt_is_never_cut(proto):
    # Trained at T = 24 (the preprocessor's length): a prompt of many more tokens, with max_length left out.
    preprocessor = ElitaCausalLMPreprocessor(ElitaTokenizer(proto=proto), sequence_length=24)
    prompt = " ".join(LINES[:6])
    length = len(np.asarray(preprocessor.tokenizer(prompt))) + 1  # with the start token
    assert length > 2 * 24
    elita = ElitaCausalLM(_backbone("elita"), preprocessor)
    elita.compile(sampler="greedy")
    text = elita.generate(prompt)
    assert text.startswith(prompt) and len(text) > len(prompt)  # the whole prompt, continued
    token_ids = elita.generate(prompt, strip_prompt=True)
    assert len(np.asarray(preprocessor.tokenizer(token_ids))) > 0
    # A model with a finite buffer (32 positions) refuses it, naming both lengths.
    transformer = ElitaCausalLM(_backbone("transformer"), preprocessor)
    transformer.compile(sampler="greedy")
    with pytest.raises(ValueError, match=rf"prompt holds {length} tokens.*reads at most 32 positions"):
        transformer.generate(prompt)
    # Past the buffer, refused before tracing: no "in user code" in the message.
    with pytest.raises(ValueError, match=r"^`max_length` 40 exceeds the 32 positions") as error:
        transformer.generate("the cat", max_length=40)
    assert "in user code" not in str(error.value)


def test_nothing_to_score_is_one_line():
    with pytest.raises(ValueError, match=r"There is nothing to score.*Received: token_ids=\[\]"):
        ElitaCausalLM(_backbone("elita")).score([])


def test_an_int8_preset_loads_through_keras_hub_s_generic_entry_points(proto, tmp_path):
    backbone = _backbone("elita")
    backbone.quantize("int8")
    x = _prompts([8], 8)
    want = backbone(x)
    backbone.save_to_preset(str(tmp_path / "backbone"))
    ElitaCausalLM(backbone, ElitaCausalLMPreprocessor(ElitaTokenizer(proto=proto), 24)).save_to_preset(
        str(tmp_path / "task")
    )
    loads = [
        keras_hub.models.Backbone.from_preset(str(tmp_path / "backbone")),
        keras_hub.models.Backbone.from_preset(str(tmp_path / "task")),
        keras_hub.models.CausalLM.from_preset(str(tmp_path / "backbone"), preprocessor=None).backbone,
        keras_hub.models.CausalLM.from_preset(str(tmp_path / "task")).backbone,
        ElitaBackbone.from_preset(str(tmp_path / "backbone")),
    ]
    for loaded in loads:
        assert loaded.token_embedding.quantization_mode == "int8"
        np.testing.assert_array_equal(loaded(x), want)


def test_quantize_warns_only_of_a_layer_with_a_matrix_it_leaves_float():
    for name, left_float in [("elita", set()), ("transformer", {"PositionEmbedding"})]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _backbone(name).quantize("int8")
        named = {str(w.message).split()[1] for w in caught if "does not have a `quantize` method" in str(w.message)}
        assert named == left_float  # not the input, dropout, the norms or softmax: they have nothing to quantize


@pytest.mark.parametrize("quantized", [False, True])
def test_a_mixed_precision_preset_loads_in_its_policy_or_in_float32_when_asked(proto, tmp_path, quantized):
    backbone = _backbone("elita", dtype="mixed_bfloat16")
    if quantized:
        backbone.quantize("int8")
    x = _prompts([8], 8)
    want = backbone(x)
    backbone.save_to_preset(str(tmp_path / "backbone"))
    task = str(tmp_path / "task")
    ElitaCausalLM(backbone, ElitaCausalLMPreprocessor(ElitaTokenizer(proto=proto), 24)).save_to_preset(task)
    loads = [
        keras_hub.models.Backbone.from_preset(str(tmp_path / "backbone")),
        keras_hub.models.CausalLM.from_preset(task).backbone,
        ElitaCausalLM.from_preset(task).backbone,
        ElitaBackbone.from_preset(task),
    ]
    for loaded in loads:
        assert loaded.compute_dtype == "bfloat16" and loaded.variable_dtype == "float32"
        assert (loaded.token_embedding.quantization_mode == "int8") == quantized
        np.testing.assert_array_equal(loaded(x), want)
    float32 = {"dtype": "float32"}
    for loaded in (ElitaCausalLM.from_preset(task, **float32).backbone, ElitaBackbone.from_preset(task, **float32)):
        assert loaded.compute_dtype == "float32" and loaded(x).dtype == "float32"
    if not quantized:
        # A preset saved before the policy was kept apart holds it as its `dtype`.
        with open(f"{task}/config.json") as f:
            saved = json.load(f)
        saved["config"].pop("mixed_precision_policy")
        saved["config"]["dtype"] = keras.dtype_policies.serialize(keras.DTypePolicy("mixed_bfloat16"))
        with open(f"{task}/config.json", "w") as f:
            json.dump(saved, f)
        assert ElitaCausalLM.from_preset(task).backbone.compute_dtype == "bfloat16"
        assert ElitaCausalLM.from_preset(task, dtype="float32").backbone.compute_dtype == "float32"


def test_stop_tokens_end_each_row():
    causal_lm = ElitaCausalLM(_backbone("linear"))
    causal_lm.compile(sampler="greedy")
    prompts = _prompts([3, 2], 16)
    full = causal_lm.generate(prompts, stop_token_ids=None)["token_ids"]
    stop = int(full[0, 4])  # the second new token of row 0
    out = causal_lm.generate(prompts, stop_token_ids=[stop])
    first_stop = 3 + list(full[0, 3:]).index(stop)
    assert list(out["padding_mask"][0]) == [True] * (first_stop + 1) + [False] * (16 - first_stop - 1)


def test_an_empty_prompt_row_and_the_original_positions_are_refused_by_name():
    with pytest.raises(tf.errors.InvalidArgumentError, match="padding_mask has a row with none"):
        _greedy(_backbone("elita")).generate(_prompts([3, 0], 8), stop_token_ids=None)
    # Refused before the step is traced: one line, not wrapped in autograph's frames.
    refusal = "^position_mode='length'.*cannot decode.*Received: position_mode='length'$"
    with pytest.raises(ValueError, match=refusal) as error:
        _greedy(_backbone("elita-reference")).generate(_prompts([3], 8), stop_token_ids=None)
    assert "in user code" not in str(error.value) and "\n" not in str(error.value)


def test_float_token_ids_are_refused_not_truncated():
    causal_lm = ElitaCausalLM(_backbone("elita"))
    floats = {"token_ids": np.array([[1.5, 2.0, 3.7]]), "padding_mask": np.ones((1, 3), "int32")}
    with pytest.raises(TypeError, match="float ids are refused.*float64"):
        causal_lm(floats)
    with pytest.raises(TypeError, match="float ids are refused.*float64"):
        causal_lm.backbone(floats)


@pytest.mark.parametrize("name", DECODING)
def test_int8_and_lora_cover_every_projection(name, tmp_path):
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
    # A short convolution's `[K, d]` kernel is no projection: it is frozen with the rest.
    projections = {
        p.rsplit("/", 1)[0]
        for p in matrices
        if p.endswith("kernel") and not p.startswith("logits") and "short_convolution" not in p
    }
    assert adapted == projections
    np.testing.assert_allclose(lora(x), want, rtol=1e-6, atol=1e-6)  # B starts at zero: the same function
    # Trained adapters merge into plain weights, W + A B: the same function, without adapters.
    rng = np.random.default_rng(0)
    for weight in lora.weights:
        if weight.path.endswith("lora_kernel_b"):
            weight.assign(rng.normal(0.0, 0.1, weight.shape).astype("float32"))
    adapted_out = lora(x)
    assert not np.allclose(adapted_out, want, rtol=1e-3, atol=1e-3)
    merged = lora.merge_lora()
    assert merged.lora_rank is None and "lora_rank" not in merged.get_config()
    np.testing.assert_allclose(merged(x), adapted_out, rtol=1e-5, atol=1e-5)

    backbone.quantize("int8")
    int8 = {w.path.rsplit("/", 1)[0] for w in backbone.weights if w.dtype == "int8"}
    head = set() if backbone.tie_word_embeddings else {"logits"}  # a tied head is the embedding
    assert projections | head | {"token_embedding"} <= int8
    got = backbone(x)
    # Close (int8 round-off through every block: 5.4% of the largest logit at most, elita-conv's), and not the
    # float model.
    assert np.abs(got - want).max() < 0.08 * np.abs(want).max()
    assert not np.array_equal(got, want)
    # The int8 lookup keeps the id checks: an error eagerly, NaN where XLA drops the assertion.
    with pytest.raises(ValueError, match=r"Token ids must be in \[0, vocabulary_size=40\).*=99"):
        backbone.token_embedding(tf.constant([[1, 99]]))
    embedded = tf.function(backbone.token_embedding, jit_compile=True)(tf.constant([[1, 99]]))
    assert np.isfinite(embedded[0, 0]).all() and np.isnan(embedded[0, 1]).all()
    # The loss path (evaluation) reads the quantized head through its call, not its int8 table.
    labels = tf.constant(x["token_ids"])
    losses = backbone.token_losses(backbone.hidden_states(labels), labels)
    np.testing.assert_allclose(
        losses, tf.nn.sparse_softmax_cross_entropy_with_logits(labels, got), rtol=1e-5, atol=1e-5
    )
    # An int8 model saves and reloads as a preset, quantized.
    backbone.save_to_preset(str(tmp_path / "int8"))
    reloaded = ElitaBackbone.from_preset(str(tmp_path / "int8"))
    assert {w.path for w in reloaded.weights if w.dtype == "int8"} == {
        w.path for w in backbone.weights if w.dtype == "int8"
    }
    np.testing.assert_array_equal(reloaded(x), got)
    # Generation runs on the quantized model too: each design's decoding step (a variant's blocks are a design's,
    # and tracing a quantized generation takes a tenth of a minute).
    if name in DESIGNS:
        out = _greedy(backbone).generate(_prompts([4, 2], 10), stop_token_ids=None)
        assert out["token_ids"].shape == (2, 10)


# --- Training: fit with the chunked output-head loss ------------------------------------------------

def test_the_first_training_step_is_traced_once(monkeypatch):
    # Keras builds the optimizer inside the first traced step when nothing built it before, and
    # TensorFlow traces a function that makes variables twice: the first step's tracing, doubled.
    traces = []
    train_step = ElitaCausalLM.train_step
    monkeypatch.setattr(ElitaCausalLM, "train_step", lambda self, data: traces.append(1) or train_step(self, data))
    causal_lm = trainable("elita")
    x, y = rule_batches(steps=1)[0]
    causal_lm.train_on_batch(x, y)
    causal_lm.train_on_batch(x, y)
    assert len(traces) == 1
    assert causal_lm.optimizer.iterations.numpy() == 2


def test_a_checkpoint_keeps_the_chunked_loss_and_a_metric_takes_keras_step(tmp_path):
    causal_lm = trainable("elita", optimizer=keras.optimizers.SGD(0.5))
    path = str(tmp_path / "model.keras")
    causal_lm.save(path)
    restored = keras.models.load_model(path)
    assert restored._chunked_loss_applies()
    x, y = rule_batches(steps=1)[0]
    np.testing.assert_allclose(restored.train_on_batch(x, y), causal_lm.train_on_batch(x, y), rtol=1e-6)
    restored.compile(
        keras.optimizers.SGD(0.5), keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    assert not restored._chunked_loss_applies()  # a metric needs the logits


def test_out_of_range_ids_under_xla_give_nan_not_a_clamped_row():
    # XLA drops assertions and clamps gathers: the embedding marks the row NaN instead.
    causal_lm = trainable("elita", jit_compile=True)
    x, y = rule_batches(steps=1)[0]
    assert np.isfinite(causal_lm.train_on_batch(x, y))
    x["token_ids"][1, 2] = 99
    assert np.isnan(causal_lm.train_on_batch(x, y))


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_architecture_learns_and_generates_under_xla(name):
    # Keras compiles with XLA by default on GPUs: the training step and the decoding loop must compile,
    # and 20 steps (with the chunked loss) learn the rule.
    causal_lm = trainable(name, jit_compile=True)
    assert causal_lm._chunked_loss_applies()
    losses = [float(causal_lm.train_on_batch(x, y)) for x, y in rule_batches()]
    assert all(np.isfinite(losses))
    # fastformerLM's head divides tied logits of N(0, 0.02) embeddings by sqrt(d): it starts
    # uniform and moves slowly at this learning rate (measured: 3.18 -> 3.08 in 20 steps).
    drop = 0.05 if name == "additive-reference" else 0.3
    assert np.mean(losses[-5:]) < losses[0] - drop, losses
    if name in DECODING:
        prompts = _prompts([3, 1], 9, vocabulary_size=24)
        causal_lm.compile(sampler="greedy", jit_compile=True)
        compiled = causal_lm.generate(prompts, stop_token_ids=None)["token_ids"]
        causal_lm.compile(sampler="greedy", jit_compile=False)
        np.testing.assert_array_equal(compiled, causal_lm.generate(prompts, stop_token_ids=None)["token_ids"])


# Every architecture under mixed_bfloat16; mixed_float16 adds Keras' loss scaling, the same for every block
# (each mixer's float16 outputs and gradients are checked by value in tests/layers/test_mixer_contract.py).
@pytest.mark.parametrize(
    "name, policy_name",
    [(name, "mixed_bfloat16") for name in sorted(ARCHITECTURES)]
    + [("elita", "mixed_float16"), ("transformer", "mixed_float16")],
)
def test_every_architecture_trains_under_mixed_precision_as_in_float32(name, policy_name):
    # Five steps from the same weights: every weight moves (the blocks train, not the output layer
    # alone), and the losses stay within a band of the float32 run's.
    batches = rule_batches(steps=5)
    reference = trainable(name)
    # Keras' float16 loss scale starts at 2^15 and skips the steps that overflow until it has come down:
    # a scale of 1 (these gradients do not underflow) applies every step, as float32 does.
    optimizer = (
        keras.optimizers.LossScaleOptimizer(elita_adam(), initial_scale=1.0) if policy_name == "mixed_float16" else None
    )
    causal_lm = trainable(name, dtype=policy_name, optimizer=optimizer)
    causal_lm.set_weights(reference.get_weights())
    start = [w.numpy().copy() for w in causal_lm.trainable_weights]
    want = [float(reference.train_on_batch(x, y)) for x, y in batches]
    got = [float(causal_lm.train_on_batch(x, y)) for x, y in batches]
    assert all(w.dtype == "float32" for w in causal_lm.weights)
    for weight, before in zip(causal_lm.trainable_weights, start):
        assert not np.array_equal(weight.numpy(), before), f"{weight.path} did not move"
    # The band: 2% of the loss (16-bit activations move each step's update a little).
    np.testing.assert_allclose(got, want, rtol=0.02)
    # Keras scales the loss under mixed_float16 by itself (the task follows its backbone's policy), and only there.
    default = trainable(name, dtype=policy_name).optimizer if policy_name == "mixed_float16" else causal_lm.optimizer
    assert isinstance(default, keras.optimizers.LossScaleOptimizer) == (policy_name == "mixed_float16")


def test_inverse_sqrt_schedule():
    schedule = InverseSqrtSchedule()
    lr = [float(schedule(step)) for step in [0, 99, 100, 399, 9999]]
    np.testing.assert_allclose(lr, [1e-3, 1e-3, 1e-2 / np.sqrt(101), 5e-4, 1e-4], rtol=1e-6)
    assert InverseSqrtSchedule.from_config(schedule.get_config()).get_config() == {"peak": 1e-3, "scale": 1e-2}
    optimizer = elita_adam()
    assert (optimizer.beta_1, optimizer.beta_2) == (0.9, 0.99)
