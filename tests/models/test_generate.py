"""Decoding from the blocks' caches: keras-hub's samplers, mixed precision, carried streams with document_starts."""

import itertools

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from elita_tf.models import ARCHITECTURES, ElitaBackbone, ElitaCausalLM

SIZE = {"hidden_dim": 32, "num_layers": 3, "num_heads": 2, "head_dim": 8, "max_sequence_length": 48}
DECODING = sorted(name for name in ARCHITECTURES if name != "elita-reference")


def _backbone(name, **overrides):
    keras.utils.set_random_seed(0)
    backbone = ElitaBackbone.from_architecture(name, **{"vocabulary_size": 30, **SIZE, **overrides})
    rng = np.random.default_rng(0)
    for w in backbone.weights:  # zero-initialised parts (3Lin Combiner, pooling vectors, queries) made non-trivial
        if np.all(w.numpy() == 0) and len(w.shape) > 0 and "bias" not in w.path and "beta" not in w.path:
            w.assign(rng.normal(size=w.shape) * 0.3)
    return backbone


def _generate(backbone, prompts, new_tokens, sampler="greedy"):
    """Continues each prompt (a list of ids) by `new_tokens`; the new ids, one list per prompt."""
    width = max(map(len, prompts)) + new_tokens
    token_ids = np.zeros((len(prompts), width), "int32")
    padding_mask = np.zeros((len(prompts), width), bool)
    for row, prompt in enumerate(prompts):
        token_ids[row, : len(prompt)], padding_mask[row, : len(prompt)] = prompt, True
    causal_lm = ElitaCausalLM(backbone)
    causal_lm.compile(sampler=sampler)
    out = causal_lm.generate({"token_ids": token_ids, "padding_mask": padding_mask}, stop_token_ids=None)
    return [list(row[len(p) : len(p) + new_tokens]) for row, p in zip(out["token_ids"], prompts)]


def _greedy_gaps(backbone):
    """Greedy decoding of two prompts of other lengths (right padding, then decoding): each pick's gap below the
    parallel forward's largest logit at its position, and that forward's largest |logit|, a row at a time."""
    prompts = [[3, 4, 5, 6, 7, 8, 9], [9, 1]]
    for prompt, new in zip(prompts, _generate(backbone, prompts, 8)):
        ids = np.array([prompt + new], "int32")
        logits = np.asarray(backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})[0], "float32")
        logits = logits[len(prompt) - 1 : -1]
        yield logits.max(axis=-1) - logits[np.arange(len(new)), new], np.abs(logits).max()


def test_samplers_with_a_seed_are_reproducible_and_rows_draw_apart():
    backbone = _backbone("elita")

    def draw(seed):
        sampler = keras_hub.samplers.TopKSampler(k=10, temperature=2.0, seed=seed)
        return _generate(backbone, [[1, 2, 3]] * 4, 12, sampler)

    first = draw(7)
    assert draw(7) == first and draw(8) != first
    assert len({tuple(row) for row in first}) > 1  # rows draw independently
    top_one = keras_hub.samplers.TopKSampler(k=1, seed=3)
    assert _generate(backbone, [[4, 5]], 6, top_one) == _generate(backbone, [[4, 5]], 6)


@pytest.mark.parametrize("policy_name", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", DECODING)
def test_mixed_precision_greedy_equals_the_parallel_forward(name, policy_name):
    # Each pick is the parallel forward's argmax, or a near-tie within 16-bit round-off of it (a bfloat16
    # elita-hybrid pick 0.56% of the largest logit below the top, measured): the steps and the parallel form
    # round in different orders.
    for gaps, largest in _greedy_gaps(_backbone(name, dtype=policy_name)):
        assert np.all(gaps <= 0.02 * largest) and np.count_nonzero(gaps) <= 1, gaps


@pytest.mark.parametrize(
    "name, overrides", [("elita", {}), ("linear", {}), ("additive", {}), ("elita", {"short_convolution": 3})]
)
def test_a_stream_in_segments_with_carried_caches_equals_one_pass_and_documents_never_meet(name, overrides):
    # Linear and additive attention keep constant-size states once their learned positions are off.
    backbone = _backbone(name, position_embedding=False, **overrides)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 30, size=(2, 70)).astype("int32")
    document_starts = np.zeros((2, 70), bool)
    document_starts[0, [12, 13, 50]] = True  # a one-token document; a document across the segment boundary at 30
    document_starts[1, [30, 64]] = True  # a document starting exactly at a segment boundary
    whole, _ = backbone.hidden_states(tokens, cache=backbone.get_initial_cache(2), document_starts=document_starts)
    whole = backbone.logits(whole).numpy()
    cache, pieces = backbone.get_initial_cache(2), []
    for start, stop in [(0, 30), (30, 31), (31, 70)]:
        hidden, cache = backbone.hidden_states(
            tokens[:, start:stop], cache=cache, document_starts=document_starts[:, start:stop]
        )
        pieces.append(backbone.logits(hidden).numpy())
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), whole, rtol=1e-4, atol=1e-4)
    # Each document equals the model run on it alone: nothing leaks across a reset.
    causal_lm = ElitaCausalLM(backbone)
    packed = causal_lm(
        {"token_ids": tokens, "padding_mask": np.ones_like(tokens), "document_starts": document_starts}
    ).numpy()
    np.testing.assert_allclose(packed, whole, rtol=1e-4, atol=1e-4)
    for row, starts in [(0, [0, 12, 13, 50, 70]), (1, [0, 30, 64, 70])]:
        for start, stop in zip(starts[:-1], starts[1:]):
            alone = tokens[row : row + 1, start:stop]
            alone = backbone({"token_ids": alone, "padding_mask": np.ones_like(alone)}).numpy()[0]
            np.testing.assert_allclose(whole[row, start:stop], alone, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(cache["position"], [20, 6])  # positions restart at each document


@pytest.mark.parametrize("name", ["elita", "linear", "transformer"])
def test_a_short_convolution_before_every_mixer_generates_what_the_parallel_forward_predicts(name):
    backbone = _backbone(name, short_convolution=4)
    assert backbone.get_layer("block_0").short_convolution.kernel_size == 4
    for gaps, _ in _greedy_gaps(backbone):  # float32: every pick the parallel forward's argmax
        assert np.all(gaps == 0), gaps


def test_a_carried_stream_with_document_starts_is_refused_by_models_with_finite_buffers():
    backbone = _backbone("transformer")
    with pytest.raises(ValueError, match="Carrying the state over a stream needs"):
        backbone.hidden_states(
            np.zeros((1, 4), "int32"), cache=backbone.get_initial_cache(1), document_starts=np.zeros((1, 4), bool)
        )


@pytest.mark.parametrize("name", ["elita", "transformer"])
def test_beam_search_with_enough_beams_is_the_exhaustive_search(name):
    # With V^(N-1) beams nothing is ever pruned: the best of all V^N continuations must come out.
    vocabulary, new_tokens = 4, 3
    backbone = _backbone(name, vocabulary_size=vocabulary)
    prompts = [[1, 2, 3, 0, 2], [3, 3, 1, 0, 1]]  # two rows, the same length: no row is inside its prompt
    sampler = keras_hub.samplers.BeamSampler(num_beams=vocabulary ** (new_tokens - 1))
    got = _generate(backbone, prompts, new_tokens, sampler)
    continuations = np.array(list(itertools.product(range(vocabulary), repeat=new_tokens)))
    for prompt, row in zip(prompts, got):
        sequences = np.concatenate([np.tile(prompt, (len(continuations), 1)), continuations], axis=1).astype("int32")
        logits = backbone({"token_ids": sequences, "padding_mask": np.ones_like(sequences)})
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float64), axis=-1).numpy()
        positions = np.arange(len(prompt) - 1, len(prompt) - 1 + new_tokens)
        scores = log_probs[:, positions, :][
            np.arange(len(continuations))[:, None], np.arange(new_tokens), continuations
        ]
        best = continuations[np.argmax(scores.sum(axis=1))]
        assert row == list(best), (row, best)


@pytest.mark.parametrize("sampler", ["beam", "contrastive"])
def test_beam_and_contrastive_samplers_widen_every_cache(sampler):
    backbone = _backbone("elita")
    samplers = {
        "beam": keras_hub.samplers.BeamSampler(num_beams=3),
        "contrastive": keras_hub.samplers.ContrastiveSampler(k=4, alpha=0.3),
    }
    out = _generate(backbone, [[3, 4, 5], [9, 1, 2]], 6, samplers[sampler])
    assert [len(row) for row in out] == [6, 6] and all(0 <= t < 30 for row in out for t in row)
