"""Multi-query associative recall (MQAR): the synthetic recall task of Zoology, as NumPy arrays (no TensorFlow).

A sequence opens with `P` key-value pairs, then queries some of its keys; the model must emit each
queried key's value. Keys come from `[1, V/2)` and values from `[V/2, V)`, every key of a sequence
distinct. The query of pair `i` sits at position `2P + 2 g_i` after a gap `g_i` drawn, without
replacement, from a power law `p(g) ∝ a (g + 1)^(a - 1)` over the `(T - 2P) / 2` gaps (`a = 0.01`
skews queries toward the start of the gap, as repeated bigrams in real text). The other positions
hold random tokens (or 0 with `random_non_queries=False`). Only the queries are scored: the target
at a query's position is its value, with weight 1; every other position has weight 0.

    pairs              queries (gaps g = 1, 0)       T = 12, P = 2, V = 12
    k1 v1 k2 v2 | k2  .  k1  .  .  .  .  .
    targets       v2             v1                   (weight 1 only there)

The definition and knobs are those of `multiquery_ar` in Zoology's `zoology/data/multiquery_ar.py`;
this is our own code (one seeded `numpy.random.Generator`, not NumPy's global state), so the same
seed gives the same arrays as each other, not as Zoology's.

References:
    - [Arora, Eyuboglu et al., 2023. Zoology: Measuring and Improving Recall in Efficient Language
      Models](https://arxiv.org/abs/2312.04927); code: https://github.com/HazyResearch/zoology
"""

import numpy as np

from elita_tf.checks import check_integer, fail

# Rows drawn at once: bounds the `[rows, V/2]` scores that pick each row's distinct keys and values.
_ROWS_PER_DRAW = 1024


def check_mqar(vocabulary_size, sequence_length, num_pairs, power_a=0.01):
    """Raises `ValueError` naming the first MQAR setting out of range (Zoology's constraints)."""
    for name, value in (
        ("vocabulary_size", vocabulary_size),
        ("sequence_length", sequence_length),
        ("num_pairs", num_pairs),
    ):
        check_integer(name, value)
    if sequence_length % 2:
        fail("sequence_length", sequence_length, "even (pairs and query slots come two positions at a time)")
    if 4 * num_pairs > sequence_length:
        fail("num_pairs", num_pairs, f"at most sequence_length / 4 = {sequence_length // 4} (pairs, then queries)")
    if vocabulary_size // 2 - 1 < num_pairs:
        fail("vocabulary_size", vocabulary_size, f"at least {2 * num_pairs + 2} for {num_pairs} distinct keys")
    if isinstance(power_a, bool) or not isinstance(power_a, (int, float)) or not 0 < power_a <= 1:
        fail("power_a", power_a, "in (0, 1] (1 places queries uniformly)")


def gap_probabilities(space, power_a=0.01):
    """Zoology's power law over the `space` query gaps: `p(g) ∝ a (g + 1)^(a - 1)`, `g = 0 .. space - 1`."""
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


def _distinct(rng, rows, low, high, count):
    """`[rows, count]` distinct integers of `[low, high)` per row, uniformly (the first `count` of a permutation)."""
    scores = rng.random((rows, high - low))
    return np.argpartition(scores, count - 1, axis=1)[:, :count] + low


def mqar_arrays(num_examples, vocabulary_size, sequence_length, num_pairs, seed, power_a=0.01, random_non_queries=True):
    """MQAR examples as arrays: token ids, targets and weights, each `[N, T]`.

    Args:
        num_examples: int. Sequences `N`.
        vocabulary_size: int. `V`: keys from `[1, V/2)`, values from `[V/2, V)`.
        sequence_length: int. `T`, even.
        num_pairs: int. Key-value pairs `P` per sequence, all queried; `4 P <= T`.
        seed: int, or a sequence of ints (`numpy.random.default_rng`'s, e.g. `(seed, epoch)`). Same seed
            and settings, same arrays.
        power_a: float in (0, 1]. The power law's `a`; 1 is uniform. Defaults to `0.01` (Zoology's).
        random_non_queries: bool. Fill the positions between queries with random tokens of `[0, V)`
            (Zoology's default) instead of 0. Defaults to `True`.

    Returns:
        `(token_ids, targets, weights)`: int32, int32 and float32 `[N, T]`. `weights` is 1 at each query,
        where `targets` is its value, and 0 elsewhere (where `targets` is 0).
    """
    check_mqar(vocabulary_size, sequence_length, num_pairs, power_a)
    rng = np.random.default_rng(seed)
    context = 2 * num_pairs
    space = (sequence_length - context) // 2
    half = vocabulary_size // 2
    log_p = np.log(gap_probabilities(space, power_a))
    token_ids = np.zeros((num_examples, sequence_length), np.int32)
    targets = np.zeros((num_examples, sequence_length), np.int32)
    for first in range(0, num_examples, _ROWS_PER_DRAW):
        rows = min(_ROWS_PER_DRAW, num_examples - first)
        keys = _distinct(rng, rows, 1, half, num_pairs)
        values = _distinct(rng, rows, half, vocabulary_size, num_pairs)
        # Sampling without replacement by the power law, as `np.random.choice(replace=False, p=p)`: the
        # order of `log p + Gumbel noise` is that of successive draws (the Gumbel-top-k trick).
        noisy = log_p - np.log(-np.log(rng.random((rows, space))))
        gaps = np.argsort(-noisy, axis=1)[:, :num_pairs]
        block = token_ids[first : first + rows]
        if random_non_queries:
            block[:] = rng.integers(0, vocabulary_size, size=block.shape)
        block[:, 0:context:2] = keys
        block[:, 1:context:2] = values
        queries = context + 2 * gaps
        np.put_along_axis(block, queries, keys, axis=1)
        np.put_along_axis(targets[first : first + rows], queries, values, axis=1)
    return token_ids, targets, (targets > 0).astype(np.float32)
