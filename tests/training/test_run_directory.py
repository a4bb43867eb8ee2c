"""`preset_of`: the commands and the training code find a run directory's preset, or say in one line why not."""

import os

import pytest

from elita_tf.cli.train import main as train_main
from elita_tf.models import ElitaBackbone
from elita_tf.training import preset_of
from elita_tf.training.run_files import ARTEFACTS, MANIFEST_FILE, PRESET_DIR, checkpoint_path, list_checkpoints


def _preset(path):
    """A directory keras-hub's loader would take for a preset (its config is all `preset_of` looks at)."""
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write("{}")
    return str(path)


def test_a_run_directory_gives_its_preset_and_a_preset_or_handle_itself(tmp_path):
    run = tmp_path / "run"
    _preset(run / "preset")
    (run / "run.json").write_text("{}")
    assert preset_of(str(run)) == str(run / "preset") and preset_of(run) == str(run / "preset")
    assert preset_of(str(run / "preset")) == str(run / "preset")
    assert preset_of("kaggle://user/elita/keras/wikitext2") == "kaggle://user/elita/keras/wikitext2"
    # The names the loop writes (tests/training/test_cli.py checks them on disk) are these.
    assert (MANIFEST_FILE, PRESET_DIR) == ("run.json", "preset") and len(set(ARTEFACTS)) == 7


def test_a_run_that_has_not_finished_or_a_path_that_is_neither_is_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")  # killed before it wrote its preset
    with pytest.raises(ValueError, match=r"has not finished.*elita-export --run-dir .*run --format preset") as error:
        preset_of(str(run))
    assert len(str(error.value).splitlines()) == 1
    (run / "preset").mkdir()  # killed while it wrote its preset
    with pytest.raises(ValueError, match="has not finished"):
        preset_of(str(run))
    (tmp_path / "empty").mkdir()
    for neither in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(ValueError, match=r"is neither an elita-train run directory \(it has no run.json\) nor"):
            preset_of(str(neither))


def test_the_commands_take_a_run_directory_where_from_preset_takes_presets_only(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as stop:
        train_main(["--init-from", str(tmp_path / "empty"), "--output-dir", str(tmp_path / "out")])
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(error.splitlines()) == 1, error
    assert f"'{tmp_path / 'empty'}' is neither an elita-train run" in error and not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        ElitaBackbone.from_preset(str(tmp_path / "empty"))


def test_checkpoints_are_named_by_step_and_listed_oldest_first(tmp_path):
    assert list_checkpoints(str(tmp_path)) == []
    for step in (40, 8, 120):
        os.makedirs(os.path.dirname(checkpoint_path(str(tmp_path), step)), exist_ok=True)
        open(checkpoint_path(str(tmp_path), step), "w").close()
    open(os.path.join(tmp_path, "checkpoints", "step-00000009.keras.tmp.keras"), "w").close()  # a save cut short
    assert list_checkpoints(str(tmp_path)) == [
        (step, str(tmp_path / "checkpoints" / f"step-{step:08d}.keras")) for step in (8, 40, 120)
    ]
