"""Every public name elita-tf 0.1.0 spelled otherwise works, with a warning naming today's (`elita_tf.renames`)."""

import argparse
import importlib
import json
import os
import pkgutil

import numpy as np
import pytest

import elita_tf
from elita_tf.cli.errors import ArgumentParser
from elita_tf.cli.flags import add_flags
from elita_tf.renames import DEPRECATED, RENAMED, RenamedKeys
from elita_tf.training.evaluate_settings import EvaluateSettings
from elita_tf.training.settings import TrainSettings

FIXTURE_RUN = os.path.join(os.path.dirname(__file__), "fixtures", "run-0.1.0", "run")


@pytest.mark.parametrize(
    "settings_class, argv, field, value, default",
    [
        (EvaluateSettings, ["--run-dir", "x", "--window-length", "4096"], "sequence_length", 4096, None),
        (TrainSettings, ["--output-dir", "x", "--documents", "blank-line"], "document_separator", "blank-line", "file"),
    ],
)
def test_an_old_flag_sets_todays_field_with_one_line_and_no_help(settings_class, argv, field, value, default, capsys):
    parser = add_flags(ArgumentParser(prog="elita-x"), settings_class)
    assert getattr(parser.parse_args(argv), field) == value
    old, new = argv[2], "--" + field.replace("_", "-")
    assert capsys.readouterr().err == f"elita-x: warning: {old} is deprecated: use {new}. Received: {old} {value}\n"
    assert old not in parser.format_help() and new in parser.format_help()
    assert getattr(parser.parse_args(argv[:2]), field) == default  # the old name sets no default of its own
    # A second parse of the same command line (elita-train's, for the flags given) says nothing.
    quiet = add_flags(argparse.ArgumentParser(), settings_class, defaults=False, warn_old_names=False)
    assert getattr(quiet.parse_args(argv), field) == value and capsys.readouterr().err == ""


def test_elita_evaluate_takes_window_length(capsys):
    from elita_tf.cli.evaluate import main

    # The old flag reaches the field, whose check answers before any run is read (not "unrecognized arguments").
    with pytest.raises(SystemExit):
        main(["--run-dir", "runs/x", "--window-length", "1"])
    warning, error = capsys.readouterr().err.splitlines()
    deprecated = "--window-length is deprecated: use --sequence-length. Received: --window-length 1"
    assert warning == f"elita-evaluate: warning: {deprecated}"
    assert "Received: sequence_length=1" in error


@pytest.mark.parametrize("old, new", sorted(RENAMED["name"].items()))
def test_an_old_public_name_is_todays_with_a_warning(old, new):
    package, _, name = old.rpartition(".")
    module, _, attribute = new.rpartition(".")
    with pytest.warns(FutureWarning, match=f"`{old}` is deprecated: use `{new}`"):
        found = getattr(importlib.import_module(package), name)
    assert found is getattr(importlib.import_module(module), attribute)
    assert name not in dir(importlib.import_module(package))
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        getattr(importlib.import_module(package), "no_such_name")


@pytest.mark.parametrize("old", sorted(DEPRECATED))
def test_a_deprecated_public_name_works_and_says_what_does_its_work(old):
    # What the deprecated cutters give: tests/data/test_token_files.py.
    package, _, name = old.rpartition(".")
    going = rf"^`{old}` is deprecated and goes in the next release: write the split's token files .*write_token_file"
    with pytest.warns(FutureWarning, match=going):
        found = getattr(importlib.import_module(package), name)
    module, _, attribute = DEPRECATED[old][0].rpartition(".")
    assert found is getattr(importlib.import_module(module), attribute)
    assert name not in dir(importlib.import_module(package))


def test_old_layer_arguments_build_todays_layers():
    from elita_tf.layers import Attention2, DecoderBlock, FeedForward2

    # 0.1.0's README example of a block.
    with pytest.warns(FutureWarning) as caught:
        mixer = Attention2(num_heads=2, head_dim=4, position_dim=4, position_scale=16)
        block = DecoderBlock(mixer, FeedForward2(factor=2, hidden_dim=6), norm="unscaled_layer_norm", norm_epsilon=1e-3)
        with pytest.warns(FutureWarning, match="`elita_tf.layers.WideFeedForward` is deprecated"):
            wide_feed_forward = elita_tf.layers.WideFeedForward
        wide = wide_feed_forward(width=24, num_layers=2)
    assert [str(w.message) for w in caught if "argument" in str(w.message)] == [
        "`FeedForward2`'s argument `hidden_dim` is deprecated: use `intermediate_dim`. Received: hidden_dim=6",
        "`DecoderBlock`'s argument `norm_epsilon` is deprecated: use `layer_norm_epsilon`. "
        "Received: norm_epsilon=0.001",
        "`FeedForward`'s argument `num_layers` is deprecated: use `shared_by`. Received: num_layers=2",
        "`FeedForward`'s argument `width` is deprecated: use `intermediate_dim`. Received: width=24",
    ]
    assert block.layer_norm_epsilon == 1e-3 and block.ffn.intermediate_dim == 6
    assert (type(wide).__name__, wide.intermediate_dim, wide.shared_by) == ("FeedForward", 24, 2)
    assert "hidden_dim" not in block.ffn.get_config()
    y = block(np.zeros((1, 5, 8), "float32"))
    assert tuple(y.shape) == (1, 5, 8)
    with pytest.raises(TypeError, match="got `hidden_dim` and `intermediate_dim`"):
        FeedForward2(hidden_dim=6, intermediate_dim=6)


def test_old_argument_names_of_ops_and_layer_calls_give_todays_results():
    from elita_tf.layers import LinearAttention
    from elita_tf.ops import causal_softmax_mean

    rng = np.random.default_rng(0)
    logits, values = rng.normal(size=(1, 2, 7)).astype("float32"), rng.normal(size=(1, 2, 7, 3)).astype("float32")
    starts = np.array([[True, False, False, True, False, False, False]])
    with pytest.warns(FutureWarning, match="`causal_softmax_mean`'s argument `resets` is deprecated: use `document_s"):
        old = causal_softmax_mean(logits, values, resets=starts)[0]
    np.testing.assert_array_equal(old, causal_softmax_mean(logits, values, document_starts=starts)[0])
    # Keras binds a layer's call to its signature first: the old name must get through it.
    layer, x = LinearAttention(num_heads=2, head_dim=2), rng.normal(size=(1, 7, 4)).astype("float32")
    with pytest.warns(FutureWarning, match="`CausalMixer.call`'s argument `resets`"):
        old = layer(x, resets=starts)
    np.testing.assert_array_equal(old, layer(x, document_starts=starts))


def test_every_renamed_argument_is_taken_where_the_table_says():
    # Each entry of the table names a function that takes the old names (a typo there, or a function
    # that lost its decorator, fails here); a decorated function missing from the table fails at import.
    taking = set()
    for info in pkgutil.walk_packages(elita_tf.__path__, "elita_tf."):
        if info.name.startswith(("elita_tf.cli", "elita_tf.backend.")):
            continue
        for value in vars(importlib.import_module(info.name)).values():
            for function in [value, *vars(value).values()] if isinstance(value, type) else [value]:
                function = getattr(function, "__func__", function)  # a classmethod's
                if getattr(function, "renamed_arguments", None) is not None:
                    taking.add(function.__qualname__.removesuffix(".__init__"))
    assert taking == set(RENAMED["argument"]) - {"CorpusSettings"}  # a manifest's record, not a call


def test_from_preset_on_a_run_directory_loads_its_preset_with_a_warning():
    from elita_tf.models import ElitaCausalLM

    preset = os.path.join(FIXTURE_RUN, "preset")
    with pytest.warns(FutureWarning, match=f"use its preset {preset!r}"):
        causal_lm = ElitaCausalLM.from_preset(FIXTURE_RUN)
    with open(os.path.join(os.path.dirname(FIXTURE_RUN), "expected.json")) as f:
        expected = json.load(f)
    ids = np.asarray(expected["token_ids"], "int32")
    logits = causal_lm({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    np.testing.assert_allclose(logits, expected["logits"], rtol=1e-6, atol=1e-6)


def test_an_old_result_key_reads_todays_value_with_a_warning():
    result = RenamedKeys("evaluate", {"sequence_length": 64, "sequences": 12})
    with pytest.warns(FutureWarning, match="`evaluate`'s result key 'windows' is deprecated: use 'sequences'"):
        assert result["windows"] == 12
    with pytest.warns(FutureWarning, match="'window_length' is deprecated: use 'sequence_length'"):
        assert result.get("window_length") == 64
    assert "windows" not in result and json.loads(json.dumps(result)) == {"sequence_length": 64, "sequences": 12}
    assert result.get("other", "none") == "none"
    with pytest.raises(KeyError):
        result["other"]
