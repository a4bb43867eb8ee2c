import inspect
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from elita_tf.models import ARCHITECTURES, ElitaBackbone
from elita_tf.models.elita_backbone import architecture_config

SMALL = {"hidden_dim": 32, "num_layers": 2, "num_heads": 2, "head_dim": 8, "max_sequence_length": 32}


def _backbone(name, **overrides):
    return ElitaBackbone.from_architecture(name, vocabulary_size=24, **{**SMALL, **overrides})


def _inputs(ids):
    ids = np.asarray(ids)
    return {"token_ids": ids, "padding_mask": np.ones_like(ids)}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_architecture_is_causal_and_round_trips_keras(name, tmp_path):
    backbone = _backbone(name)
    ids = np.random.default_rng(1).integers(0, 24, size=(2, 20))
    logits = backbone(_inputs(ids))
    assert logits.shape == (2, 20, 24) and logits.dtype == tf.float32
    changed = ids.copy()
    changed[:, 12:] = (changed[:, 12:] + 1) % 24
    # (elita-reference's positions move with the length, but at one length the past never sees the future.)
    np.testing.assert_allclose(backbone(_inputs(changed))[:, :12], logits[:, :12], rtol=1e-5, atol=1e-5)
    path = str(tmp_path / f"{name}.keras")
    backbone.save(path)
    np.testing.assert_allclose(keras.models.load_model(path)(_inputs(ids)), logits, rtol=1e-6, atol=1e-6)
    assert ElitaBackbone.from_config(backbone.get_config()).get_config() == backbone.get_config()


def test_the_config_is_the_architecture():
    backbone = _backbone("additive", sliding_window_sizes=(2, None), dropout=0.1, tie_word_embeddings=True)
    config = backbone.get_config()
    want = architecture_config(
        "additive", vocabulary_size=24, sliding_window_sizes=[2, None], dropout=0.1, tie_word_embeddings=True, **SMALL
    )
    assert {key: config[key] for key in want} == want
    assert config["blocks"] == ["additive", "additive"] and backbone.blocks == ["additive", "additive"]
    assert set(config) - set(want) <= {"name", "trainable", "dtype"}  # Keras' own fields, nothing re-mapped


def test_a_none_window_is_global_for_additive_and_the_default_for_3lin():
    def windows(name, sizes):
        backbone = _backbone(name, sliding_window_sizes=sizes)
        return [backbone.get_layer(f"block_{i}").mixer.sliding_window_size for i in range(2)]

    assert windows("additive", (None, 3)) == [None, 3]
    assert windows("additive", None) == [4, None]
    assert windows("3lin", (None, 5)) == [64, 5]
    assert windows("transformer", None) == [None, None] and windows("transformer", (4, None)) == [4, None]


def test_mixed_blocks_and_wide_ffn_is_shared():
    backbone = ElitaBackbone(
        vocabulary_size=24,
        blocks=("elita", "transformer", "additive", "simplified"),
        ffn="wide",
        **{**SMALL, "num_layers": 4},
    )
    ffns = {id(backbone.get_layer(f"block_{i}").ffn) for i in range(4)}
    wide = backbone.get_layer("block_0").ffn
    assert len(ffns) == 1 and wide.name == "wide_ffn" and wide.inner.kernel.shape == (32, 4 * 32 * 4)
    assert backbone(_inputs(np.zeros((1, 5), int))).shape == (1, 5, 24)


def test_an_attention_interval_puts_attention_at_the_first_block_and_every_kth_above_it():
    for num_layers, interval, transformers in [(2, 3, [0]), (6, 3, [0, 3]), (7, 3, [0, 3, 6]), (4, 1, [0, 1, 2, 3])]:
        backbone = ElitaBackbone(vocabulary_size=24, attention_interval=interval, **{**SMALL, "num_layers": num_layers})
        assert [i for i, block in enumerate(backbone.blocks) if block == "transformer"] == transformers
        mixers = {type(backbone.get_layer(f"block_{i}").mixer).__name__ for i in transformers}
        assert mixers == {"CausalSelfAttention"} and not backbone.carries_state
        assert ElitaBackbone.from_config(backbone.get_config()).blocks == backbone.blocks
    with pytest.raises(ValueError, match=r"Received: attention_interval=0$"):
        ElitaBackbone(vocabulary_size=24, attention_interval=0)


def test_reference_architectures_build_the_originals_wrappers():
    backbone = _backbone("additive-reference")
    names = [layer.name for layer in backbone.layers]
    assert "embedding_norm" in names and "final_norm" not in names and "logits" not in names
    block = backbone.get_layer("block_0")
    assert block.mixer_norm.epsilon == block.ffn_norm.epsilon == 1e-5
    assert not block.ffn.inner.use_bias and block.ffn.inner.kernel_initializer.stddev == 0.02
    # Tied logits over sqrt(hidden_dim), after no final norm.
    ids = np.random.default_rng(2).integers(0, 24, size=(1, 7))
    hidden = backbone.hidden_states(ids)
    embeddings = backbone.token_embedding.embeddings
    np.testing.assert_allclose(
        backbone(_inputs(ids)), hidden @ tf.transpose(embeddings) / np.sqrt(32), rtol=1e-5, atol=1e-5
    )

    simplified = _backbone("simplified-reference")
    first, second = (simplified.get_layer(f"block_{i}").mixer for i in range(2))
    assert first.value_projection and not second.value_projection
    assert "logits" not in [layer.name for layer in simplified.layers]
    # GPT-2's epsilon everywhere (the final LayerNorm included), and RMSNorm as the authors' code computes it.
    norm = simplified.get_layer("block_0").mixer_norm
    assert type(norm).__name__ == "OuterEpsilonRMSNormalization" and norm.epsilon == 1e-5
    assert simplified.get_layer("final_norm").epsilon == 1e-5

    elita = _backbone("elita-reference")
    mixer = elita.get_layer("block_0").mixer
    assert (mixer.position_mode, mixer.logit_clip) == ("length", 20.0)
    with pytest.raises(ValueError, match="position_mode='length' moves every position.*cannot decode"):
        elita.get_initial_cache(1)


def test_bad_arguments_get_keras_style_errors():
    with pytest.raises(ValueError, match=r"Unknown architecture.*Received: name='gpt'"):
        ElitaBackbone.from_architecture("gpt", vocabulary_size=40)
    for kwargs, message in [
        ({"hidden_dim": 0}, "`hidden_dim` must be a positive integer. Received: hidden_dim=0"),
        ({"max_sequence_length": 1}, "Received: max_sequence_length=1"),
        ({"position_scale": 1}, "`position_scale` must be None or an integer >= 2. Received: position_scale=1"),
        ({"position_mode": "sliding"}, "Received: position_mode='sliding'"),
        ({"logit_clip": -1}, "Received: logit_clip=-1"),
        ({"num_layers": 3, "blocks": ("elita", "linear")}, "one per layer (3)"),
        ({"blocks": "lstm"}, "block types from"),
        ({"ffn": "moe"}, "Received: ffn='moe'"),
        ({"norm": "batch_norm"}, "Received: norm='batch_norm'"),
        ({"layer_norm_epsilon": 0}, "Received: layer_norm_epsilon=0"),
        ({"sliding_window_sizes": (1, 2, 3)}, "one size (a positive integer or None) per layer"),
        ({"dropout": 1.0}, "`dropout` must be in [0, 1). Received: dropout=1.0"),
        ({"scaled_tied_logits": True}, "set `tie_word_embeddings=True` too"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            ElitaBackbone(vocabulary_size=40, **kwargs)


def test_tied_embeddings_share_the_matrix():
    backbone = _backbone("elita", tie_word_embeddings=True)
    assert not any(layer.name == "logits" for layer in backbone.layers)
    assert backbone(_inputs(np.zeros((1, 3), int))).shape == (1, 3, 24)


def test_parameters_without_embeddings_leave_out_the_tables_and_the_head():
    backbone = _backbone("transformer")
    tables = 24 * 32 + 32 * 32 + (32 * 24 + 24)  # token table, position table, head with bias
    assert backbone.count_params_without_embeddings() == backbone.count_params() - tables
    tied = _backbone("elita", tie_word_embeddings=True)
    assert tied.count_params_without_embeddings() == tied.count_params() - 24 * 32


def test_token_ids_must_be_integers_in_range_and_positions_bounded():
    backbone = _backbone("transformer")
    with pytest.raises(Exception, match="max_sequence_length=32"):
        backbone(_inputs(np.zeros((1, 40), int)))
    # Eagerly: Keras' `take` wrapped -3 to the last rows; the int32 Input truncated 1.5 to 1.
    with pytest.raises(ValueError, match=r"vocabulary_size=24\). Received: token_ids\[0, 1\]=-3"):
        backbone(_inputs([[1, -3, 2]]))
    with pytest.raises(ValueError, match=r"Received: token_ids\[1, 0\]=24"):
        backbone(_inputs([[1, 2], [24, 3]]))
    with pytest.raises(TypeError, match="float ids are refused.*float64"):
        backbone(_inputs([[1.5, 2.0, 3.0]]))
    # In a graph (predict, fit, a SavedModel): the step fails naming the ids and their positions.
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"vocabulary_size=24.*\[30\] \[at\] \[\[0 2\]\]"):
        backbone.predict(_inputs([[1, 2, 30]]), verbose=0)


def test_position_scale_is_apart_from_the_buffers():
    keras.utils.set_random_seed(0)
    short = _backbone("elita")
    long = _backbone("elita", max_sequence_length=4 * 32, position_scale=32)
    long.set_weights(short.get_weights())
    x = _inputs(np.random.default_rng(0).integers(0, 24, size=(1, 20)))
    np.testing.assert_allclose(long(x), short(x), rtol=1e-6, atol=1e-6)
    assert ElitaBackbone.from_config(long.get_config()).position_scale == 32
    clamped = _backbone("elita", position_mode="clamped")
    assert ElitaBackbone.from_config(clamped.get_config()).get_layer("block_0").mixer.position_mode == "clamped"


def test_a_dtype_policy_reaches_every_layer_and_leaves_the_global_policy():
    backbone = _backbone("elita", dtype="mixed_bfloat16")
    assert keras.config.dtype_policy().name == "float32"
    block = backbone.get_layer("block_0")
    assert block.compute_dtype == block.mixer.compute_dtype == block.mixer.k1_dense.compute_dtype == "bfloat16"
    assert {w.dtype for w in backbone.weights} == {"float32"}
    # Logits in the compute dtype, as keras-hub's models (the training loss is float32 by its own path).
    assert backbone(_inputs([[1, 2, 3]])).dtype == "bfloat16"


def test_the_architecture_arguments_are_listed_once_and_are_the_signatures():
    # `ARGUMENT_CHECKS` names every argument of the architecture once; the signature is the same list.
    from elita_tf.models.architectures import ARGUMENT_CHECKS, REQUIRED_ARGUMENTS

    signature = [name for name in inspect.signature(ElitaBackbone.__init__).parameters]
    assert list(ARGUMENT_CHECKS) == [n for n in signature if n not in ("self", "lora_rank", "dtype", "kwargs")]
    assert set(REQUIRED_ARGUMENTS) <= set(ARGUMENT_CHECKS)
    assert set(architecture_config("elita", vocabulary_size=8)) == set(ARGUMENT_CHECKS)


@pytest.mark.parametrize(
    "name, overrides, carries",
    [
        ("elita", {}, True),
        ("elita", {"position_mode": "length"}, False),  # positions that move with the length
        ("elita-reference", {}, False),
        ("linear", {}, False),  # learned positions
        ("linear", {"position_embedding": False}, True),
        ("additive", {"position_embedding": False}, True),
        ("transformer", {"position_embedding": False}, False),  # a key/value buffer
        ("3lin", {}, False),
    ],
)
def test_carries_state_is_one_answer_with_one_message(name, overrides, carries):
    from elita_tf.models.architectures import check_carries_state

    backbone = _backbone(name, **overrides)
    assert backbone.carries_state is carries
    if carries:
        backbone.check_carries_state()
        check_carries_state(backbone.get_config())
        return
    message = (
        r"Carrying the state over a stream needs blocks that keep a constant-size state \(elita, linear, additive\), "
        r"no learned positions and positions that do not move with the length\. "
        rf"Received: blocks=\['{name.split('-')[0]}'\]"
    )
    for check in (backbone.check_carries_state, lambda: check_carries_state(backbone.get_config())):
        with pytest.raises(ValueError, match=message):
            check()
