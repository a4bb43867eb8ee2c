"""Every download source format, served from 127.0.0.1: parquet rows, the zip archive, the
fallback between them, the published-count check, and the error when all fail."""

import functools
import http.server
import os
import threading
import zipfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from elita_tf.data import sources
from elita_tf.data.sources import (
    SPLIT_FILES,
    DownloadError,
    check_counts,
    fetch_wikitext,
)
from elita_tf.data.wikitext import CONFIGS, load_wikitext
from tests.conftest import write_tiny_wikitext

CONFIG = next(c for c in CONFIGS if c.name == "wikitext-2-v1")


class _Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        # As the author's mirror does: Python's default User-Agent is refused.
        if self.headers.get("User-Agent", "").startswith("Python-urllib"):
            self.send_error(403)
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny WikiText published as Hugging Face parquet files and as the original zip."""
    root = tmp_path_factory.mktemp("served")
    corpus = write_tiny_wikitext(str(root / "corpus"))
    files = {split: os.path.join(corpus, f"wiki.{stem}.tokens") for split, stem in SPLIT_FILES.items()}
    for split, path in files.items():
        with open(path, encoding="utf-8") as f:
            rows = list(f)  # one row a line, newline kept, as in the repository
        (root / "hf" / CONFIG.name).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": rows}), root / "hf" / CONFIG.name / f"{split}-00000-of-00001.parquet")
    with zipfile.ZipFile(root / f"{CONFIG.name}.zip", "w") as archive:
        for path in files.values():
            archive.write(path, f"{CONFIG.folder}/{os.path.basename(path)}")
    counts = {
        "lines": {split: sources.count(path, True)[0] for split, path in files.items()},
        "tokens": {split: sources.count(path, True)[1] for split, path in files.items()},
    }
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", files, counts
    server.shutdown()
    server.server_close()


@pytest.fixture
def local_sources(served, monkeypatch):
    url, files, counts = served
    monkeypatch.setitem(sources.PUBLISHED_COUNTS, CONFIG.name, counts)
    monkeypatch.delenv("ELITA_WIKITEXT_DIR", raising=False)

    def use(**templates):
        monkeypatch.setattr(sources, "SOURCES", {name: t.format(url=url) for name, t in templates.items()})

    return use, files


HF = "{url}/hf/{{config}}/{{split}}-{{shard:05d}}-of-{{shards:05d}}.parquet"
ZIP = "{url}/{{config}}.zip"
MISSING = "{url}/nothing/{{config}}.zip"


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def test_parquet_rows_become_the_original_files(local_sources, tmp_path):
    use, files = local_sources
    use(huggingface=HF)
    root, source = fetch_wikitext(CONFIG, str(tmp_path))
    for split, stem in SPLIT_FILES.items():
        assert _read(os.path.join(root, f"wiki.{stem}.tokens")) == _read(files[split])
    assert source.endswith(".parquet")


def test_the_zip_mirror_is_read_with_a_user_agent_it_accepts(local_sources, tmp_path):
    use, files = local_sources
    use(smerity=ZIP)
    root, _ = fetch_wikitext(CONFIG, str(tmp_path))
    assert _read(os.path.join(root, "wiki.train.tokens")) == _read(files["train"])


def test_a_failing_source_falls_back_to_the_next(local_sources, tmp_path, capsys):
    use, _ = local_sources
    use(huggingface=MISSING.replace(".zip", "-{{split}}-{{shard}}-{{shards}}.parquet"), smerity=ZIP)
    root, source = fetch_wikitext(CONFIG, str(tmp_path))
    assert source.endswith(".zip") and "huggingface failed" in capsys.readouterr().err


def test_data_that_differs_from_the_published_counts_is_refused(local_sources, tmp_path, monkeypatch):
    use, files = local_sources
    use(smerity=ZIP)
    counts = dict(sources.PUBLISHED_COUNTS[CONFIG.name])
    counts["lines"] = {**counts["lines"], "test": counts["lines"]["test"] + 1}
    monkeypatch.setitem(sources.PUBLISHED_COUNTS, CONFIG.name, counts)
    with pytest.raises(DownloadError, match=r"smerity: ValueError: .*test: \d+ lines, published \d+"):
        fetch_wikitext(CONFIG, str(tmp_path))


def test_when_every_source_fails_the_error_names_them_and_the_offline_setting(local_sources, tmp_path):
    use, _ = local_sources
    use(first=MISSING, second=MISSING)
    with pytest.raises(DownloadError) as error:
        fetch_wikitext(CONFIG, str(tmp_path))
    message = str(error.value)
    assert "- first: HTTPError" in message and "- second: HTTPError" in message
    assert "--data-dir" in message and "ELITA_WIKITEXT_DIR" in message


def test_the_builder_downloads_by_default_and_records_the_source(local_sources, tmp_path):
    use, files = local_sources
    use(huggingface=HF)
    splits, info = load_wikitext(CONFIG.name, tfds_dir=str(tmp_path / "tfds"), with_info=True)
    with open(files["test"], encoding="utf-8") as f:
        want = [line.strip() for line in f if line.strip()]
    assert [line.decode() for line in splits["test"].as_numpy_iterator()] == want
    assert info["source"].endswith(".parquet") and len(info["sha256"]) == 64


def test_the_environment_points_the_loader_at_local_files(local_sources, tmp_path, monkeypatch):
    use, files = local_sources
    use(first=MISSING)  # no download can succeed: the local directory must be used
    monkeypatch.setenv("ELITA_WIKITEXT_DIR", os.path.dirname(files["train"]))
    _, info = load_wikitext(CONFIG.name, tfds_dir=str(tmp_path / "tfds"), with_info=True)
    assert info["source"] == os.path.dirname(files["train"])


def test_the_real_wikitext_2_matches_the_published_counts():
    # The copy beside the repository, when there is one: the counts in the table are the real ones.
    directory = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "wikitext-2")
    if not os.path.isdir(directory):
        # CI has the copy: there (ELITA_REQUIRE_SHARED_DATA=1, set by .ci/run) its absence is a failure, not a skip.
        if os.environ.get("ELITA_REQUIRE_SHARED_DATA") == "1":
            pytest.fail(f"ELITA_REQUIRE_SHARED_DATA=1 but there is no WikiText-2 at {os.path.abspath(directory)}")
        pytest.skip("no local WikiText-2")
    paths = {split: os.path.join(directory, f"wiki.{stem}.tokens") for split, stem in SPLIT_FILES.items()}
    check_counts("wikitext-2-v1", paths, "the local copy")
