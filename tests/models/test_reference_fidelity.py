"""`elita-reference` is the original ELiTA code's block stack, written here from its equations in numpy.

The original (`Model2` of acosharma/elita-transformer) runs, per block,
`x += Attention2(LN(x), t); x += FeedForward2(LN(x))` with one LayerNorm without scale or centre
(epsilon 1e-3), positions `u_i = t * i / (N - 1)`, and every logit clipped to ±20 before a plain
exponential, cumulative sum and division.
"""

import numpy as np
import pytest

from elita_tf.models import ElitaBackbone

WIDTH, HEADS, HEAD_DIM, POSITIONS, LAYERS = 24, 3, 8, 6, 3


def _layer_norm(x):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-3)


def _original_attention(x, w):
    """The original `Attention2.call(x, t=1.0)`: exp(clip(., ±20)), cumsum, divide; per head, then O."""
    length = x.shape[1]
    u = np.linspace(0.0, 1.0, length)  # tf.linspace(0.0, t, N)
    p1 = np.einsum("hp,hpn->hn", w["c"], np.sin(w["a1"][..., None] * u + w["b1"][..., None]))
    p2 = np.einsum("hp,hpn->hn", w["c"], np.sin(w["a2"][..., None] * u + w["b2"][..., None]))
    kappa = np.einsum("bnd,hd->bhn", x, w["k1"]) + p1
    delta = np.einsum("bnd,hd->bhn", x, w["k2"])
    rho = p2 + np.einsum("bnd,hd->bhn", x, w["k3"])
    e_kappa, e_delta, e_rho = (np.exp(np.clip(z, -20.0, 20.0)) for z in (kappa, delta, rho))
    values = np.einsum("bnd,hda->bhna", x, w["value_kernel"])
    numerator = e_delta[..., None] * values + e_rho[..., None] * np.cumsum(e_kappa[..., None] * values, axis=2)
    denominator = e_delta + e_rho * np.cumsum(e_kappa, axis=2)
    y = numerator / denominator[..., None]
    return np.einsum("bhna,hwa->bnw", y, w["output_kernel"])


def _original_feedforward(x, w):
    swish = lambda z: z / (1.0 + np.exp(-z))  # noqa: E731
    alpha, beta = swish(x @ w["w1"] + w["b1"]), swish(x @ w["w2"] + w["b2"])
    return np.einsum("bni,bnj,ijw->bnw", alpha, beta, w["w3"]) + w["b3"]


def _weights(layer, names):
    return {name: np.asarray(getattr(layer, name), np.float64) for name in names}


@pytest.mark.parametrize("logit_scale", [1.0, 8.0])  # 8: logits far past ±20, where the clip decides
def test_elita_reference_blocks_equal_the_original_code(logit_scale):
    backbone = ElitaBackbone.from_architecture(
        "elita-reference",
        vocabulary_size=50,
        hidden_dim=WIDTH,
        num_layers=LAYERS,
        num_heads=HEADS,
        head_dim=HEAD_DIM,
        position_dim=POSITIONS,
        max_sequence_length=64,
    )
    rng = np.random.default_rng(0)
    for weight in backbone.weights:  # beyond the small initial range, so positions, gates and clips matter
        scale = logit_scale if weight.path.split("/")[-2] in ("k1", "k2", "k3") else 0.3
        weight.assign(rng.normal(size=weight.shape) * scale)
    x = rng.normal(size=(2, 50, WIDTH))

    got, want = x.astype("float32"), x
    for i in range(LAYERS):
        block = backbone.get_layer(f"block_{i}")
        got = block(got)
        attention = _weights(block.mixer, ["k1", "k2", "k3", "a1", "a2", "b1", "b2", "c"])
        attention.update(_weights(block.mixer, ["value_kernel", "output_kernel"]))
        want = want + _original_attention(_layer_norm(want), attention)
        want = want + _original_feedforward(
            _layer_norm(want), _weights(block.ffn, ["w1", "b1", "w2", "b2", "w3", "b3"])
        )
    got = np.asarray(got, np.float64)
    assert np.isfinite(want).all()
    # Float32 round-off: 5e-6 of the largest output at most, measured; a position or clip change gives 6e-3 or more.
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max())
