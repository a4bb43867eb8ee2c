import keras
import numpy as np
import pytest

from elita_tf.generation import (
    Generator,
    empty_caches,
    forward_with_cache,
    generate,
    right_pad,
)
from elita_tf.models import PRESETS, build_decoder, preset

CONFIG = {"width": 32, "num_layers": 3, "num_heads": 2, "head_dim": 8, "context_length": 48}


def _model(name, **overrides):
    keras.utils.set_random_seed(0)
    config = preset(name, vocab_size=30, **{**CONFIG, **overrides})
    model = build_decoder(config)
    rng = np.random.default_rng(0)
    for w in model.weights:  # zero-initialised parts (3Lin Combiner, pooling vectors, queries) made non-trivial
        if np.all(w.numpy() == 0) and len(w.shape) > 0 and "bias" not in w.path and "beta" not in w.path:
            w.assign(rng.normal(size=w.shape) * 0.3)
    return model, config


def _greedy_by_recomputing(model, prompt, steps):
    seq = list(prompt)
    for _ in range(steps):
        seq.append(int(np.argmax(model(np.array([seq]))[0, -1])))
    return seq[len(prompt) :]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_cached_greedy_equals_recomputing_the_full_forward(name):
    model, config = _model(name)
    prompts = [[3, 4, 5, 6, 7, 8, 9], [9, 1], [2]]  # different lengths, one right-padded batch
    out = Generator(model, config)(prompts, 10).numpy()
    for prompt, got in zip(prompts, out):
        assert list(got) == _greedy_by_recomputing(model, prompt, 10)


@pytest.mark.parametrize("sampler", ["top_k", "top_p"])
def test_sampling_is_reproducible(sampler):
    model, config = _model("elita")
    generator = Generator(model, config, sampler=sampler, temperature=2.0, top_k=10, top_p=0.95)
    a, b = generator([[1, 2, 3]] * 4, 12, seed=7), generator([[1, 2, 3]] * 4, 12, seed=7)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, generator([[1, 2, 3]] * 4, 12, seed=8))
    assert len({tuple(row) for row in a.numpy()}) > 1  # rows draw independently


def test_top_k_one_is_greedy_and_compiles_once():
    model, config = _model("linear")
    greedy = Generator(model, config)
    top1 = Generator(model, config, sampler="top_k", top_k=1)
    np.testing.assert_array_equal(greedy([[4, 5]], 6), top1([[4, 5]], 6, seed=3))
    greedy([[1, 2, 3, 4, 5]], 9)
    greedy([[1], [2, 3]], 3)
    assert greedy.run.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("policy_name", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_mixed_precision_greedy_equals_the_parallel_forward(name, policy_name, policy):
    policy(policy_name)
    model, config = _model(name)
    prompts = [[3, 4, 5, 6, 7, 8, 9], [9, 1]]
    out = Generator(model, config)(prompts, 8).numpy()
    for prompt, got in zip(prompts, out):
        logits = model(np.array([prompt + list(got)]))[0, len(prompt) - 1 : -1]
        assert list(got) == list(np.argmax(logits, axis=-1))


def test_elita_decodes_past_the_training_length():
    model, config = _model("elita")
    assert config.decode_limit is None
    prompts = [[3, 4, 5, 6, 7, 8, 9] * 4, [9, 1]]
    steps = 4 * config.context_length - len(prompts[0])  # to 4x the training length
    out = Generator(model, config)(prompts, steps).numpy()
    for prompt, got in zip(prompts, out):
        logits = model(np.array([prompt + list(got)]))[0, len(prompt) - 1 : -1]
        assert list(got) == list(np.argmax(logits, axis=-1))


def test_errors():
    model, config = _model("elita")
    with pytest.raises(ValueError, match="sampler"):
        Generator(model, config, sampler="beam")
    with pytest.raises(ValueError, match=r"Prompt 1 is empty.*end-of-line id"):
        right_pad([[1], [], [2]])
    with pytest.raises(ValueError, match="no prompts"):
        right_pad([])
    transformer, transformer_config = _model("transformer")
    with pytest.raises(ValueError, match=r"\(40 tokens\) and max_new_tokens=20 exceed the 48 positions"):
        generate(transformer, transformer_config, [[1] * 40], max_new_tokens=20)
    with pytest.raises(ValueError, match="max_new_tokens=-1"):
        generate(model, config, [[1, 2]], max_new_tokens=-1)
    with pytest.raises(TypeError, match="max_new_tokens=2.0"):
        generate(model, config, [[1, 2]], max_new_tokens=2.0)
    with pytest.raises(ValueError, match=r"vocabulary_size=30\). Received: prompts\[1, 0\]=30"):
        generate(model, config, [[1, 2], [30]], max_new_tokens=2)
    with pytest.raises(TypeError, match="float ids are refused"):
        generate(model, config, np.array([[1.5, 2.0]]), max_new_tokens=2)
    # No new tokens is an empty result, not an error.
    assert generate(model, config, [[1, 2], [3]], max_new_tokens=0).shape == (2, 0)


@pytest.mark.parametrize("name", ["elita", "linear", "additive"])
def test_a_stream_in_segments_with_carried_caches_equals_one_pass_and_documents_never_meet(name):
    # Linear and additive attention keep constant-size states once their learned positions are off.
    model, config = _model(name, position_embedding=False)
    layers = {layer.name: layer for layer in model.layers}
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 30, size=(2, 70)).astype("int32")
    resets = np.zeros((2, 70), bool)
    resets[0, [12, 13, 50]] = True  # a one-token document; a document across the segment boundary at 30
    resets[1, [30, 64]] = True  # a document starting exactly at a segment boundary
    whole, _ = forward_with_cache(config, layers, tokens, empty_caches(config, layers, 2), resets=resets)
    caches, pieces = empty_caches(config, layers, 2), []
    for start, stop in [(0, 30), (30, 31), (31, 70)]:
        logits, caches = forward_with_cache(config, layers, tokens[:, start:stop], caches, resets=resets[:, start:stop])
        pieces.append(logits.numpy())
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), whole.numpy(), rtol=1e-4, atol=1e-4)
    # Each document equals the model run on it alone: nothing leaks across a reset.
    for row, starts in [(0, [0, 12, 13, 50, 70]), (1, [0, 30, 64, 70])]:
        for start, stop in zip(starts[:-1], starts[1:]):
            alone = model(tokens[row : row + 1, start:stop]).numpy()[0]
            np.testing.assert_allclose(whole.numpy()[row, start:stop], alone, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(caches["position"], [20, 6])  # positions restart at each document


def test_resets_are_refused_by_models_with_finite_buffers():
    model, config = _model("transformer")
    layers = {layer.name: layer for layer in model.layers}
    with pytest.raises(ValueError, match="constant-size state"):
        forward_with_cache(
            config, layers, np.zeros((1, 4), "int32"), empty_caches(config, layers, 1), resets=np.zeros((1, 4), bool)
        )
