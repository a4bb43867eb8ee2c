import itertools

import numpy as np
import pytest

from elita_tf.layers import (
    AdditiveAttention,
    Attention2,
    CausalSelfAttention,
    DecoderBlock,
    FeedForward,
    FeedForward2,
    LinearAttention,
    ShapedAttention,
    TriLinearAttention,
)
from tests.backend_utils import numpy

LAYERS = [
    lambda: AdditiveAttention(num_heads=2),
    lambda: Attention2(num_heads=2, head_dim=8, position_dim=4),
    lambda: FeedForward2(factor=8),
    lambda: LinearAttention(num_heads=2, head_dim=8),
    lambda: ShapedAttention(num_heads=2, key_initializer="glorot_uniform", query_initializer="glorot_uniform"),
    lambda: DecoderBlock(ShapedAttention(num_heads=2), FeedForward(use_bias=False), residual="parallel"),
    lambda: CausalSelfAttention(num_heads=2),
    lambda: FeedForward(intermediate_dim=8),
    lambda: TriLinearAttention(query_dim=8, lowrank_dim=16, combiner_initializer="glorot_uniform"),
]


@pytest.mark.parametrize("make", LAYERS)
def test_random_weights_are_drawn_independently(make):
    # A shared unseeded initializer would give k1 == k2 == k3 (Keras draws the same values per instance).
    layer = make()
    layer.build((None, None, 8))
    random = [numpy(w) for w in layer.weights if np.unique(numpy(w)).size > 1]
    assert random, "no random weight"
    for a, b in itertools.combinations(random, 2):
        if a.shape == b.shape:
            assert not np.allclose(a, b)
