"""The one test harness every causal sequence layer runs (each token mixer, and `DecoderBlock` recipes).

What every layer guarantees, whatever it computes: causality; prefill, chunks and
single steps from a named cache equal the parallel form; padding and the Keras
mask reach no output; configs and `.keras` files round-trip; mixed precision and
long inputs stay finite; XLA compiles the forward and the decoding step;
non-finite inputs stay causal; bad calls are refused with the value. The layer
files test only their own math against naive references. Every check runs on each
Keras backend (TensorFlow, JAX, PyTorch); "compiled" is XLA on TensorFlow and `jax.jit`.
"""

import warnings

import keras
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
    ShortConvolution,
    TriLinearAttention,
)
from tests.backend_utils import BACKEND, compiled, numpy, outputs_and_gradients, random_normal, tensor
from tests.layers.reference_check import assert_mixed_precision_finite

WIDTH = 16
MIXERS = {
    "attention2": lambda: Attention2(2, 8, 4, position_scale=128, logit_clip=20.0, chunk_size=16),
    "linear": lambda: LinearAttention(2, 8, chunk_size=16),
    "additive_global": lambda: AdditiveAttention(2, chunk_size=16),
    "additive_window_8": lambda: AdditiveAttention(2, sliding_window_size=8),
    "additive_window_40": lambda: AdditiveAttention(2, sliding_window_size=40, chunk_size=32),
    "causal_self_attention": lambda: CausalSelfAttention(2, head_dim=4, max_sequence_length=128),
    "causal_self_attention_window_8": lambda: CausalSelfAttention(
        2, head_dim=4, max_sequence_length=128, sliding_window_size=8
    ),
    "shaped": lambda: ShapedAttention(2, value_projection=True, max_sequence_length=128),
    # The Combiner starts at zero (the layer is the identity): give it weights that show a leak.
    "3lin": lambda: TriLinearAttention(
        16, 16, sliding_window_size=8, max_sequence_length=128, combiner_initializer="glorot_uniform"
    ),
    "3lin_wide": lambda: TriLinearAttention(
        16, 16, sliding_window_size=8, wide=True, max_sequence_length=128, combiner_initializer="glorot_uniform"
    ),
    # The blocks of the decoder recipes.
    "block_elita": lambda: DecoderBlock(Attention2(2, 8, 4), FeedForward2(), norm="unscaled_layer_norm"),
    "block_transformer": lambda: DecoderBlock(
        CausalSelfAttention(2, max_sequence_length=128), FeedForward(activation="gelu"), dropout=0.1
    ),
    "block_sas_p": lambda: DecoderBlock(
        ShapedAttention(2, max_sequence_length=128),
        FeedForward(use_bias=False),
        norm="rms_norm",
        residual="parallel",
    ),
    "block_sas": lambda: DecoderBlock(
        ShapedAttention(2, max_sequence_length=128), FeedForward(), norm="rms_norm", residual="sequential"
    ),
    "short_convolution": lambda: ShortConvolution(4, use_bias=True),
    # A short convolution before a mixer with a constant-size state and before a buffer of positions.
    "block_linear_short_convolution": lambda: DecoderBlock(
        LinearAttention(2, 8, chunk_size=16), FeedForward(), short_convolution=ShortConvolution(3)
    ),
    "block_transformer_short_convolution": lambda: DecoderBlock(
        CausalSelfAttention(2, max_sequence_length=128), FeedForward(activation="gelu"),
        short_convolution=ShortConvolution(4),
    ),
    "block_3lin": lambda: DecoderBlock(
        TriLinearAttention(
            16, 16, sliding_window_size=8, max_sequence_length=128, combiner_initializer="glorot_uniform"
        ),
        norm=None,
    ),
}
# Layers with no projection of their own, which int8 and LoRA leave as they are.
PROJECTIONLESS = {"short_convolution"}
# Long inputs for the mixed-precision check: linear-time layers at 16K, quadratic ones shorter.
LONG = {"causal_self_attention": 2048, "shaped": 2048, "3lin_wide": 128, "block_transformer": 2048}
LONG.update({"block_sas_p": 2048, "block_sas": 2048, "block_3lin": 4096, "3lin": 4096})
LONG["block_transformer_short_convolution"] = LONG["causal_self_attention_window_8"] = 2048


def _mixer(name):
    """The layer with live weights: every weight that starts constant (zero queries and pooling
    vectors, biases, norm scales, gains) gets a random spread around its start, so each
    layer's own path (pooling logits, gates, centring) is what the contract checks."""
    keras.utils.set_random_seed(0)
    layer = MIXERS[name]()
    layer.build((None, None, WIDTH))
    rng = np.random.default_rng(1)
    for w in layer.weights:
        value = numpy(w)
        if np.all(value == value.flat[0]):
            w.assign(value + rng.normal(size=w.shape) * 0.3)
    return layer


# Machine epsilon of each 16-bit compute dtype: the unit the mixed-precision tolerances are counted in.
EPSILON = {"float16": 2.0**-10, "bfloat16": 2.0**-7}


def _inputs(length=100, batch=2):
    return np.random.default_rng(0).normal(size=(batch, length, WIDTH)).astype("float32")


def _outputs_and_gradients(layer, x):
    """`[y, dL/dx, dL/dw for every trainable weight]` of `L = sum(y * c)`, a fixed random `c`, as float32 arrays."""
    cotangent = np.random.default_rng(2).normal(size=x.shape).astype("float32")
    (y,), grads = outputs_and_gradients(layer, [tensor(x)], [cotangent], layer.trainable_weights)
    return [np.asarray(a, np.float32) for a in [y, *grads]]


def _exactly_zero_gradient(weight):
    """A key bias of softmax attention adds `q · b` to every logit of a row, which the softmax takes
    away again: its gradient is zero in exact arithmetic, and round-off in float32."""
    softmax = "causal_self_attention" in weight.path or "shaped_attention" in weight.path
    return softmax and weight.path.endswith("key/bias")


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_every_weight_is_live_and_reaches_the_output(name):
    layer = _mixer(name)
    _, _, *grads = _outputs_and_gradients(layer, _inputs(40))
    largest = max(np.linalg.norm(g) for g in grads)
    for weight, grad in zip(layer.trainable_weights, grads):
        assert np.any(numpy(weight) != 0), f"{weight.path} is zero"
        reach = np.linalg.norm(grad) / largest
        if _exactly_zero_gradient(weight):
            assert reach < 1e-5, f"{weight.path}: a gradient of {reach:.3g} where the softmax cancels it"
        else:
            assert np.any(grad != 0), f"{weight.path} does not reach the output"


def _decode(layer, x, bounds, mask=None):
    """Outputs of `layer` fed `x` in the chunks `bounds` from an empty cache, and the last cache."""
    cache, outputs = layer.get_initial_cache(x.shape[0]), []
    for start, stop in bounds:
        kwargs = {} if mask is None else {"padding_mask": mask[:, start:stop]}
        y, cache = layer(x[:, start:stop], cache=cache, **kwargs)
        outputs.append(numpy(y))
    return np.concatenate(outputs, axis=1), cache


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_later_inputs_never_change_earlier_outputs(name):
    layer = _mixer(name)
    x = _inputs()
    changed = x.copy()
    changed[:, 42:] = changed[:, 42:] * -3.0 + 1.0
    np.testing.assert_array_equal(numpy(layer(x))[:, :42], numpy(layer(changed))[:, :42])


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_prefill_chunks_and_steps_from_the_named_cache_equal_the_parallel_form(name):
    layer = _mixer(name)
    x = _inputs(60)
    initial = layer.get_initial_cache(2)
    assert isinstance(initial, dict) and tuple(initial) == tuple(layer.cache_names)
    decoded, cache = _decode(layer, x, [(0, 30), (30, 41)] + [(t, t + 1) for t in range(41, 60)])
    np.testing.assert_allclose(decoded, numpy(layer(x)), rtol=1e-4, atol=1e-4)
    # A new dict of the same fixed shapes and dtypes, whatever the length decoded.
    assert cache is not initial and tuple(cache) == tuple(initial)
    for entry in initial:
        assert (cache[entry].shape, cache[entry].dtype) == (initial[entry].shape, initial[entry].dtype), entry
    if "position" in cache:
        np.testing.assert_array_equal(numpy(cache["position"]), [60, 60])


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_rows_decode_at_their_own_positions(name):
    """Right padding ends a row's sequence: what follows continues it, in each row separately."""
    layer = _mixer(name)
    x = _inputs(40)
    mask = np.ones((2, 40), bool)
    mask[1, 20:30] = False  # row 1: 20 real tokens, then right padding, in the first chunk
    first, cache = layer(x[:, :30], padding_mask=mask[:, :30], cache=layer.get_initial_cache(2))
    np.testing.assert_allclose(numpy(first)[0], numpy(layer(x[:1, :30]))[0], rtol=1e-4, atol=1e-4)
    if "position" in cache:
        np.testing.assert_array_equal(numpy(cache["position"]), [30, 20])
    # Row 1 continues with its tokens 30.. as positions 20..: as if the padding had never been there.
    later = [layer(x[:, 30:35], cache=cache)]
    for t in range(35, 40):
        later.append(layer(x[:, t : t + 1], cache=later[-1][1]))
    later = np.concatenate([numpy(y) for y, _ in later], axis=1)
    row1 = np.concatenate([x[1:, :20], x[1:, 30:]], axis=1)
    np.testing.assert_allclose(later[1], numpy(layer(row1))[0, 20:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_a_nonfinite_input_never_changes_earlier_rows(name, bad, choice_form):
    layer = _mixer(name)
    x = _inputs()
    spoiled = x.copy()
    spoiled[0, 50, 3] = bad  # one channel of one position, in the middle of a chunk
    clean, y = numpy(layer(x)), numpy(layer(spoiled))
    np.testing.assert_array_equal(y[0, :50], clean[0, :50])  # exactly: nothing travelled back
    assert np.isnan(y[0, 50:]).all()  # and nothing after it looks valid
    np.testing.assert_array_equal(y[1], clean[1])  # the other sequence is untouched


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_padded_positions_reach_no_output_whatever_they_hold(name, choice_form):
    layer = _mixer(name)
    x = _inputs()
    mask = np.ones((2, 100), bool)
    mask[:, 35:40] = False
    mask[1, :3] = False  # left padding too
    noisy = x.copy()
    noisy[:, 35:40] = np.nan
    noisy[1, :3] = np.inf
    zeros = np.where(mask[..., None], x, 0.0).astype("float32")
    y, want = numpy(layer(noisy, padding_mask=mask)), numpy(layer(zeros, padding_mask=mask))
    assert np.isfinite(y[mask]).all()
    np.testing.assert_allclose(y[mask], want[mask], rtol=1e-5, atol=1e-5)
    # Decoding with the mask gives the same outputs at real positions.
    decoded, _ = _decode(layer, noisy, [(0, 25)] + [(t, t + 1) for t in range(25, 42)] + [(42, 100)], mask)
    np.testing.assert_allclose(decoded[mask], y[mask], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_the_keras_mask_is_used_and_propagated(name):
    layer = _mixer(name)
    tokens = keras.Input((None,), dtype="int32")
    embedding = keras.layers.Embedding(20, WIDTH, mask_zero=True)
    ids = np.array([[3, 4, 0, 0, 5, 6], [0, 4, 7, 9, 5, 1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no sublayer may warn that it drops the mask
        outputs = layer(embedding(tokens))
        got = keras.Model(tokens, outputs)(ids)
    got = numpy(got)  # outside: PyTorch's own conversion to NumPy warns of NumPy 2
    assert outputs._keras_mask is not None
    want = numpy(layer(embedding(ids), padding_mask=ids != 0))
    np.testing.assert_allclose(got[ids != 0], want[ids != 0], rtol=1e-6)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_config_and_keras_file_round_trip(name, tmp_path):
    """A `.keras` file saved on this backend reloads with the same outputs."""
    layer = _mixer(name)
    config = layer.get_config()
    assert type(layer).from_config(config).get_config() == config
    inputs = keras.Input((None, WIDTH))
    model = keras.Model(inputs, layer(inputs))
    path = str(tmp_path / "layer.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    x = _inputs(33)
    np.testing.assert_array_equal(numpy(model(x)), numpy(restored(x)))
    assert type(restored.layers[-1]) is type(layer)


def _projections(layer):
    return [sub for sub in layer._flatten_layers(include_self=False) if hasattr(sub, "enable_lora")]


@pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method")  # norms, softmax, dropout
@pytest.mark.parametrize("name", sorted(set(MIXERS) - PROJECTIONLESS))
def test_int8_quantization_keeps_the_outputs_within_its_round_off(name):
    layer = _mixer(name)
    x = _inputs(40)
    before = numpy(layer(x))
    inputs = keras.Input((None, WIDTH))
    keras.Model(inputs, layer(inputs)).quantize("int8")
    assert {sub.quantization_mode for sub in _projections(layer)} == {"int8"}
    after = numpy(layer(x))
    # int8 rounds each kernel column to 1/127 of its largest entry, and each input row likewise.
    np.testing.assert_allclose(after, before, rtol=0.1, atol=0.05 * np.abs(before).max())
    assert np.abs(after - before).max() > 0  # the quantized kernels are the ones used


@pytest.mark.parametrize("name", sorted(set(MIXERS) - PROJECTIONLESS))
def test_lora_starts_as_the_layer_and_trains_only_its_adapters(name):
    layer = _mixer(name)
    x = _inputs(40)
    before = numpy(layer(x))
    projections = _projections(layer)
    for sub in projections:
        sub.enable_lora(2)
    np.testing.assert_array_equal(numpy(layer(x)), before)  # B starts at zero
    adapters = [w for w in layer.trainable_weights if "lora_kernel" in w.path]
    assert len(adapters) == 2 * len(projections)
    assert not any(sub._kernel.trainable for sub in projections)
    _, _, *grads = _outputs_and_gradients(layer, x)
    by_path = {w.path: g for w, g in zip(layer.trainable_weights, grads)}
    assert all(np.any(by_path[w.path] != 0) for w in adapters if w.path.endswith("lora_kernel_b"))


@pytest.mark.parametrize("policy_name", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_mixed_precision_long_input_is_finite(name, policy_name, policy):
    policy(policy_name)
    layer = _mixer(name)
    x = random_normal([1, LONG.get(name, 16384), WIDTH], seed=12, scale=3.0)
    assert_mixed_precision_finite(layer, x)


@pytest.mark.parametrize("policy_name", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_mixed_precision_outputs_and_gradients_follow_float32(name, policy_name, policy):
    """The outputs and the gradient of the input and of every weight under a 16-bit compute dtype
    equal a float32 layer's with the same weights, within a few units of that dtype's round-off
    (relative to each tensor's norm): a path whose gradient drops its 16-bit part fails."""
    reference = _outputs_and_gradients(_mixer(name), _inputs(40))
    policy(policy_name)
    layer = _mixer(name)
    got = _outputs_and_gradients(layer, _inputs(40))
    names = ["outputs", "inputs"] + [w.path for w in layer.trainable_weights]
    zero = [False, False] + [_exactly_zero_gradient(w) for w in layer.trainable_weights]
    tolerance = 16 * EPSILON[layer.compute_dtype]
    if BACKEND != "tensorflow" and name in ("block_sas", "block_sas_p"):
        # torch's and JAX's seeded weights put FFN ReLU inputs within float16 round-off of 0: a flip is 1.7-4.3%
        tolerance *= 4
    largest = max(np.linalg.norm(want) for want in reference[2:])
    for label, exactly_zero, g, want in zip(names, zero, got, reference):
        # Against the tensor's own size; a gradient that is zero in exact arithmetic, against the largest.
        norm = largest if exactly_zero else np.linalg.norm(want)
        error = np.linalg.norm(g - want) / norm
        assert error <= tolerance, f"{label}: relative error {error:.3g} > {tolerance:.3g}"


@pytest.mark.parametrize("policy_name", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_mixed_precision_prefill_and_steps_agree_with_the_parallel_form_within_round_off(name, policy_name, policy):
    policy(policy_name)
    layer = _mixer(name)
    x = _inputs(20)
    initial = layer.get_initial_cache(2)
    decoded, cache = _decode(layer, x, [(0, 16)] + [(t, t + 1) for t in range(16, 20)])
    # A cache keeps the dtypes it was made with (float32 recurrent states, not the compute dtype).
    assert {k: t.dtype for k, t in cache.items()} == {k: t.dtype for k, t in initial.items()}
    parallel = numpy(layer(x))
    assert np.isfinite(decoded).all()
    # The two forms round in a different order: a few units of the compute dtype's epsilon apart.
    tolerance = 8 * EPSILON[layer.compute_dtype]
    np.testing.assert_allclose(decoded, parallel, rtol=tolerance, atol=tolerance * np.abs(parallel).max())


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_xla_compiles_the_forward_and_the_decoding_step(name):
    """The same weights give the same outputs compiled (XLA on TensorFlow, `jax.jit`), forward and decoding."""
    layer = _mixer(name)
    x = tensor(_inputs(40))
    forward = compiled(lambda x: layer(x))
    # XLA fuses and orders float32 sums differently: compare at reference tolerance.
    np.testing.assert_allclose(numpy(forward(x)), numpy(layer(x)), rtol=1e-4, atol=1e-4)
    step = compiled(lambda x, cache: layer(x, cache=cache))
    y, cache = layer(x[:, :30], cache=layer.get_initial_cache(2))
    outputs = [numpy(y)]
    for t in range(30, 40):
        y, cache = step(x[:, t : t + 1], cache)
        outputs.append(numpy(y))
    np.testing.assert_allclose(np.concatenate(outputs, 1), numpy(layer(x)), rtol=1e-4, atol=1e-4)


# The mixers whose decoding state is a buffer of `max_sequence_length` positions, with a buffer of 8.
BUFFERED = {
    "causal_self_attention": lambda: CausalSelfAttention(2, head_dim=4, max_sequence_length=8),
    "shaped": lambda: ShapedAttention(2, value_projection=True, max_sequence_length=8),
    "3lin_wide": lambda: TriLinearAttention(
        16, 16, wide=True, max_sequence_length=8, combiner_initializer="glorot_uniform"
    ),
}


@pytest.mark.parametrize("name", sorted(BUFFERED))
def test_a_compiled_step_past_a_full_buffer_gives_nan_not_a_plausible_output(name):
    """Eagerly a full buffer is an error (each layer's tests); compiled, where no check runs, the row gets NaN from
    then on, and a row with room left decodes as before."""
    if BACKEND == "torch":
        pytest.skip("PyTorch is checked eagerly (torch.compile takes minutes on a CPU)")
    keras.utils.set_random_seed(0)
    layer = BUFFERED[name]()
    layer.build((None, None, WIDTH))
    x = tensor(_inputs(10))
    mask = np.ones((2, 8), bool)
    mask[1, 6:] = False  # row 1 keeps two free slots: it ends after its 6 real positions
    _, cache = layer(x[:, :8], padding_mask=mask, cache=layer.get_initial_cache(2))
    step = compiled(lambda x, cache: layer(x, cache=cache))
    y, cache = step(x[:, 8:9], cache)
    assert np.isnan(numpy(y)[0]).all() and np.isfinite(numpy(y)[1]).all()
    y, _ = step(x[:, 9:10], cache)
    assert np.isnan(numpy(y)[0]).all() and np.isfinite(numpy(y)[1]).all()


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_an_empty_sequence_leaves_the_cache_as_it_was(name):
    layer = _mixer(name)
    empty = np.zeros((2, 0, WIDTH), "float32")
    assert layer(empty).shape == (2, 0, WIDTH)
    _, cache = _decode(layer, _inputs(5), [(0, 5)])
    y, after = layer(empty, cache=cache)
    assert y.shape == (2, 0, WIDTH)
    for entry in cache:
        np.testing.assert_array_equal(numpy(after[entry]), numpy(cache[entry]))


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_decoding_after_a_nonfinite_input_agrees_with_the_parallel_form(name):
    layer = _mixer(name)
    x = _inputs(12)
    x[:, 5] = np.nan
    parallel = numpy(layer(x))
    decoded, _ = _decode(layer, x, [(0, 8)] + [(t, t + 1) for t in range(8, 12)])
    np.testing.assert_allclose(decoded[:, :5], parallel[:, :5], rtol=1e-4, atol=1e-4)
    assert np.isnan(parallel[:, 5:]).all()
    # Decoding, NaN while the state holds what the prefill of 8 left (all NaN): for ever, or the K - 1 steps a
    # short convolution's state takes to renew.
    held = 8 + getattr(layer, "kernel_size", 5) - 1
    assert np.isnan(decoded[:, 5:held]).all() and np.isfinite(decoded[:, held:]).all()


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_bad_calls_are_refused_with_the_value(name):
    layer = _mixer(name)
    x = _inputs(10)
    with pytest.raises(ValueError, match=r"(ndim=3|\[batch, time, width\]).*\(10, 16\)"):
        layer(x[0])
    with pytest.raises(ValueError, match="axis -1"):
        layer(np.zeros((2, 10, WIDTH + 1), "float32"))
    with pytest.raises(TypeError, match="int32"):
        layer(tensor(np.zeros([2, 10, WIDTH], "int32")))
    with pytest.raises(ValueError, match=r"padding_mask.*Received: padding_mask.shape=\(2, 9\)"):
        layer(x, padding_mask=np.ones((2, 9), bool))
    with pytest.raises(TypeError, match="padding_mask.dtype=float32"):
        layer(x, padding_mask=np.ones((2, 10), "float32"))
    with pytest.raises(ValueError, match="made for batch size 1.*batch size 2"):
        layer(x, cache=layer.get_initial_cache(1))
    cache = layer.get_initial_cache(2)
    with pytest.raises(ValueError, match=r"a dict of \[.*\]. Received: tuple"):
        layer(x, cache=tuple(cache.values()))
    with pytest.raises(ValueError, match=r"Received: \[.*'stray'"):
        layer(x, cache={**cache, "stray": tensor(np.zeros([2], "float32"))})


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_a_padded_decoding_step_holding_nan_changes_nothing(name):
    layer = _mixer(name)
    x = _inputs(12)
    y, cache = layer(x[:, :8], cache=layer.get_initial_cache(2))
    _, padded = layer(np.full((2, 1, WIDTH), np.nan, "float32"), padding_mask=np.zeros((2, 1), bool), cache=cache)
    _, zeros = layer(np.zeros((2, 1, WIDTH), "float32"), padding_mask=np.zeros((2, 1), bool), cache=cache)
    for entry in padded:
        np.testing.assert_array_equal(numpy(padded[entry]), numpy(zeros[entry]))
    y, _ = layer(x[:, 8:9], cache=padded)
    assert np.isfinite(numpy(y)).all()


def _takes_document_starts(name):
    layer = MIXERS[name]()
    return getattr(layer, "mixer", layer).document_starts_with_cache


RESETTING = [name for name in sorted(MIXERS) if _takes_document_starts(name)]


def _packed_document_starts(length):
    document_starts = np.zeros((2, length), bool)
    document_starts[0, [0, 9, 10, 33]] = True  # a one-token document at 9
    document_starts[1, [17, 40]] = (
        True  # row 1's first document starts at 0 with no reset: the empty state all the same
    )
    return document_starts


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_packed_documents_equal_each_document_alone_in_outputs_and_gradients(name):
    """Without a cache every mixer takes `document_starts`: no document sees another (block-diagonal softmax,
    restarted states and buffers, a start position per document), to the gradients."""
    layer = _mixer(name)
    x = tensor(_inputs(60))
    document_starts = _packed_document_starts(60)
    cotangent = np.random.default_rng(2).normal(size=x.shape).astype("float32")

    def outputs_and_gradients_of(run):
        (y,), grads = outputs_and_gradients(run, [x], [cotangent], layer.trainable_weights)
        return [y, *grads]

    def apart(x):
        rows = []
        for row in range(2):
            bounds = sorted({0, *np.flatnonzero(document_starts[row])}) + [60]
            pieces = [layer(x[row : row + 1, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
            rows.append(keras.ops.concatenate(pieces, axis=1))
        return keras.ops.concatenate(rows, axis=0)

    packed = outputs_and_gradients_of(lambda x: layer(x, document_starts=tensor(document_starts)))
    alone = outputs_and_gradients_of(apart)
    for got, want in zip(packed, alone):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    # And compiled (XLA, `jax.jit`).
    together = compiled(lambda x, starts: layer(x, document_starts=starts))(x, tensor(document_starts))
    np.testing.assert_allclose(numpy(together), numpy(apart(x)), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("name", RESETTING)
def test_document_starts_equal_each_document_run_apart_in_parallel_chunks_and_steps(name):
    """Packed documents see nothing of each other, nor of the cache they continue; positions restart."""
    layer = _mixer(name)
    x = _inputs(60)
    document_starts = np.zeros((2, 60), bool)
    document_starts[0, [0, 9, 10, 33]] = True  # row 0 starts afresh; a one-token document at 9
    document_starts[1, [17, 40]] = True  # row 1 continues what came before
    _, before = layer(_inputs(7)[::-1].copy(), cache=layer.get_initial_cache(2))

    def apart(row):
        starts = sorted({0, *np.flatnonzero(document_starts[row])}) + [60]
        cache = {k: v[row : row + 1] for k, v in before.items()} if not document_starts[row, 0] else None
        pieces = []
        for start, stop in zip(starts[:-1], starts[1:]):
            cache = layer.get_initial_cache(1) if start > 0 or cache is None else cache
            y, cache = layer(x[row : row + 1, start:stop], cache=cache)
            pieces.append(numpy(y))
        return np.concatenate(pieces, axis=1), cache

    want = [apart(row) for row in range(2)]
    together, cache = layer(x, cache=before, document_starts=document_starts)
    steps, step_cache = [], before
    for t in range(60):
        y, step_cache = layer(x[:, t : t + 1], cache=step_cache, document_starts=document_starts[:, t : t + 1])
        steps.append(numpy(y))
    chunked, chunk_cache = [], before
    for start, stop in [(0, 25), (25, 26), (26, 60)]:
        y, chunk_cache = layer(x[:, start:stop], cache=chunk_cache, document_starts=document_starts[:, start:stop])
        chunked.append(numpy(y))
    for got, got_cache in [(numpy(together), cache), (np.concatenate(steps, 1), step_cache)] + [
        (np.concatenate(chunked, 1), chunk_cache)
    ]:
        for row in range(2):
            np.testing.assert_allclose(got[row], want[row][0][0], rtol=1e-4, atol=1e-4)
            for key in cache:
                np.testing.assert_allclose(
                    numpy(got_cache[key])[row], numpy(want[row][1][key])[0], rtol=1e-4, atol=1e-4
                )
    # Without a cache, a row's first document starts from the empty state.
    np.testing.assert_allclose(
        numpy(layer(x, document_starts=document_starts))[1, :17], numpy(layer(x[1:, :17]))[0], rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("name", [name for name in sorted(MIXERS) if name not in RESETTING])
def test_a_buffer_of_positions_refuses_document_starts_with_a_cache_but_a_step_restarts(name):
    layer = _mixer(name)
    x = _inputs(9)
    _, cache = layer(x[:, :4], cache=layer.get_initial_cache(2))
    with pytest.raises(ValueError, match="cannot take `document_starts` with a cache over several positions"):
        layer(x[:, 4:], cache=cache, document_starts=np.zeros((2, 5), bool))
    # One step that starts a document starts from the empty cache.
    step, _ = layer(x[:, 4:5], cache=cache, document_starts=np.array([[True], [False]]))
    fresh, _ = layer(x[:1, 4:5], cache=layer.get_initial_cache(1))
    continued, _ = layer(x[1:, 4:5], cache={k: v[1:] for k, v in cache.items()})
    np.testing.assert_allclose(numpy(step), np.concatenate([numpy(fresh), numpy(continued)]), rtol=1e-5, atol=1e-5)
