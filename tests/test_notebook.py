import os
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import write_tiny_wikitext

NOTEBOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "colab", "ELiTA_wikitext.ipynb")


def test_committed_notebook_has_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")
    assert any("parameters" in cell.metadata.get("tags", []) for cell in notebook.cells)


def _run_notebook(tmp_path, monkeypatch):
    """Executes the notebook in the smoke configuration on a tiny corpus; returns its printed text."""
    data = write_tiny_wikitext(str(tmp_path / "wikitext"))
    monkeypatch.setenv("ELITA_SMOKE", "1")
    monkeypatch.setenv("ELITA_WIKITEXT_DIR", data)
    monkeypatch.setenv("ELITA_OUTPUT_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # A failing cell raises CellExecutionError here.
    NotebookClient(
        notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]
    assert any("image/png" in out.get("data", {}) for out in outputs)  # the plot, inline
    assert any("| elita |" in out.get("data", {}).get("text/markdown", "") for out in outputs)  # the table
    assert os.path.exists(tmp_path / "runs" / "elita_saved_model" / "saved_model.pb")
    return "".join(out.get("text", "") for out in outputs if out.get("output_type") == "stream")


def test_notebook_runs_top_to_bottom_in_the_smoke_configuration(tmp_path, monkeypatch):
    assert "The game was released ->" in _run_notebook(tmp_path, monkeypatch)


@pytest.mark.skipif(
    os.environ.get("ELITA_COLAB_LIKE") != "1",
    reason="needs a runtime without elita-tf and with its own TensorFlow (.ci/run's Colab-like stage)",
)
def test_notebook_installs_itself_and_keeps_the_runtime_tensorflow(tmp_path, monkeypatch):
    # A runtime like Colab's: TensorFlow and Jupyter preinstalled, elita-tf not. The notebook's
    # install cell must add the package without replacing that TensorFlow.
    def installed(package):
        # Asked from another directory: the repository (on sys.path here) may hold an .egg-info.
        code = (
            f"import importlib.metadata as m\ntry: print(m.version({package!r}))\nexcept m.PackageNotFoundError: pass"
        )
        return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True).stdout.strip()

    assert not installed("elita-tf"), "this stage needs a runtime without the package"
    preinstalled = installed("tensorflow")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.setenv("ELITA_INSTALL", "1")
    monkeypatch.setenv("ELITA_REPO_URL", f"file://{repo}")
    text = _run_notebook(tmp_path, monkeypatch)
    assert f"| tensorflow {preinstalled} |" in text
    assert "The game was released ->" in text
    assert installed("tensorflow") == preinstalled  # on disk too, not only the module the kernel imported
    assert installed("elita-tf")
