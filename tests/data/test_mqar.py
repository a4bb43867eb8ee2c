"""MQAR's generator (`elita_tf.data.mqar`): Zoology's definition, deterministic by seed, and its tf.data batches."""

import numpy as np
import pytest

from elita_tf.data.mqar import gap_probabilities, mqar_arrays

V, T, P = 64, 32, 4


def _arrays(**overrides):
    settings = dict(num_examples=200, vocabulary_size=V, sequence_length=T, num_pairs=P, seed=0) | overrides
    return mqar_arrays(**settings)


def test_same_seed_same_arrays_other_seed_other_arrays():
    first, again, other = _arrays(), _arrays(), _arrays(seed=1)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])
    assert [a.dtype for a in first] == [np.int32, np.int32, np.float32]
    assert all(a.shape == (200, T) for a in first)


def test_pairs_hold_distinct_keys_and_values_from_the_two_halves():
    token_ids, _, _ = _arrays()
    keys, values = token_ids[:, 0 : 2 * P : 2], token_ids[:, 1 : 2 * P : 2]
    assert ((keys >= 1) & (keys < V // 2)).all()
    assert ((values >= V // 2) & (values < V)).all()
    assert all(len(set(row)) == P for row in keys)
    assert all(len(set(row)) == P for row in values)


@pytest.mark.parametrize("random_non_queries", [True, False])
def test_every_key_is_queried_once_and_its_target_is_its_value(random_non_queries):
    token_ids, targets, weights = _arrays(random_non_queries=random_non_queries)
    for ids, target, weight in zip(token_ids, targets, weights):
        pairs = dict(zip(ids[0 : 2 * P : 2], ids[1 : 2 * P : 2]))
        queries = np.flatnonzero(weight)
        assert sorted(ids[queries]) == sorted(pairs)  # each key once
        assert all(target[q] == pairs[ids[q]] for q in queries)
        assert (queries >= 2 * P).all() and (queries % 2 == 0).all()  # after the pairs, on a query slot
        if not random_non_queries:
            rest = np.ones(T, bool)
            rest[: 2 * P] = rest[queries] = False
            assert (ids[rest] == 0).all()
    if random_non_queries:  # fillers drawn from the whole vocabulary
        assert len(np.unique(token_ids[:, 2 * P :])) > V // 2


def test_weights_are_one_at_the_queries_and_zero_elsewhere():
    _, targets, weights = _arrays()
    assert set(np.unique(weights)) == {0.0, 1.0}
    np.testing.assert_array_equal(weights > 0, targets > 0)
    np.testing.assert_array_equal(weights.sum(axis=1), np.full(len(weights), P))
    assert (weights[:, : 2 * P] == 0).all()


def test_queries_follow_the_power_law_over_the_gap():
    space = (T - 2 * P) // 2
    # One pair: its gap is one draw from the power law, as Zoology's `np.random.choice(p=p)`.
    _, _, weights = _arrays(num_examples=20000, num_pairs=1)
    gaps = (np.flatnonzero(weights.reshape(-1)) % T - 2) // 2
    counts = np.bincount(gaps, minlength=(T - 2) // 2)
    np.testing.assert_allclose(counts / counts.sum(), gap_probabilities((T - 2) // 2), atol=0.01)
    # Several pairs: skewed toward the start of the gap; with a = 1, uniform.
    skewed = (np.flatnonzero(_arrays(num_examples=2000)[2].reshape(-1)) % T - 2 * P) // 2
    uniform = (np.flatnonzero(_arrays(num_examples=2000, power_a=1.0)[2].reshape(-1)) % T - 2 * P) // 2
    assert np.mean(skewed < space // 2) > 0.6
    assert abs(np.mean(uniform < space // 2) - 0.5) < 0.05
    assert gap_probabilities(space)[0] > 2 * gap_probabilities(space)[-1]


@pytest.mark.parametrize(
    "overrides, name",
    [
        ({"sequence_length": 31}, "sequence_length"),
        ({"num_pairs": 9}, "num_pairs"),
        ({"vocabulary_size": 8}, "vocabulary_size"),
        ({"power_a": 0.0}, "power_a"),
        ({"num_pairs": 0}, "num_pairs"),
    ],
)
def test_bad_settings_name_the_value(overrides, name):
    with pytest.raises(ValueError, match=f"Received: {name}="):
        _arrays(**overrides)
