"""Where WikiText is served today, and the published counts every download is checked against.

The dataset's original archive (`s3.amazonaws.com/research.metamind.io/wikitext/`) has answered
403 since 2024, so downloads try, in order:

1. `huggingface`: the dataset's Hugging Face repository `Salesforce/wikitext`, one parquet file
   per split (two for WikiText-103's train split), one row per line of the original file;
2. `smerity`: the author's mirror `wikitext.smerity.com`, the original zip archives.

Whatever the source, the three split files are written in the original layout
(`wiki.{train,valid,test}.{tokens,raw}`) and checked against the published line counts (and,
for the tokenised variants, token counts with one end-of-line token a line). A source that
fails, or whose files do not match, is reported and the next one is tried; when all fail the
error names each one and says how to point the loader at local files.
"""

import os
import shutil
import sys
import urllib.request
import zipfile

SPLIT_FILES = {"train": "train", "validation": "valid", "test": "test"}
# The offline setting: a local WikiText directory used whenever no directory is passed.
DATA_DIR_ENV = "ELITA_WIKITEXT_DIR"
# Each variant: its folder inside the archive, its files' suffix, a description.
VARIANTS = {
    "wikitext-2-raw-v1": ("wikitext-2-raw", "raw", "WikiText-2, raw text"),
    "wikitext-2-v1": ("wikitext-2", "tokens", "WikiText-2, <unk> tokens"),
    "wikitext-103-raw-v1": ("wikitext-103-raw", "raw", "WikiText-103, raw text"),
    "wikitext-103-v1": ("wikitext-103", "tokens", "WikiText-103, <unk> tokens"),
}
CONFIG_NAMES = list(VARIANTS)

# Lines of each split file, and tokens (words plus one end-of-line a line) of the tokenised variants.
_LINES_2 = {"train": 36_718, "validation": 3_760, "test": 4_358}
_LINES_103 = {"train": 1_801_350, "validation": 3_760, "test": 4_358}
_TOKENS_VALID_TEST = {"validation": 217_646, "test": 245_569}
PUBLISHED_COUNTS = {
    "wikitext-2-raw-v1": {"lines": _LINES_2},
    "wikitext-2-v1": {"lines": _LINES_2, "tokens": {"train": 2_088_628, **_TOKENS_VALID_TEST}},
    "wikitext-103-raw-v1": {"lines": _LINES_103},
    "wikitext-103-v1": {"lines": _LINES_103, "tokens": {"train": 103_227_021, **_TOKENS_VALID_TEST}},
}
_TRAIN_SHARDS = {"wikitext-2-raw-v1": 1, "wikitext-2-v1": 1, "wikitext-103-raw-v1": 2, "wikitext-103-v1": 2}

# Templates with {config} (and {split}, {shard}, {shards} for parquet files).
SOURCES = {
    "huggingface": "https://huggingface.co/datasets/Salesforce/wikitext/resolve/main/"
    "{config}/{split}-{shard:05d}-of-{shards:05d}.parquet",
    "smerity": "https://wikitext.smerity.com/{config}.zip",
}
# Some servers refuse Python's default User-Agent.
USER_AGENT = "Mozilla/5.0 (compatible; elita-tf WikiText loader)"


class DownloadError(RuntimeError):
    """No source could provide the dataset; the message names each source and why."""


def download(url, path, timeout=60):
    """Fetches `url` to `path` (through a temporary file), with a progress bar on a terminal."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    tmp = path + ".part"
    with urllib.request.urlopen(request, timeout=timeout) as response, open(tmp, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0)
        done = 0
        for block in iter(lambda: response.read(1 << 20), b""):
            out.write(block)
            done += len(block)
            if sys.stderr.isatty():
                size = f"{done / 2**20:.1f}" + (f"/{total / 2**20:.1f}" if total else "")
                print(f"\r{os.path.basename(path)}: {size} MiB", end="", file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    os.replace(tmp, path)
    return path


def _from_parquet(config, directory, template):
    import pyarrow.parquet as pq

    for split, stem in SPLIT_FILES.items():
        shards = _TRAIN_SHARDS[config.name] if split == "train" else 1
        lines = []
        for shard in range(shards):
            url = template.format(config=config.name, split=split, shard=shard, shards=shards)
            local = download(url, os.path.join(directory, "parquet", f"{split}-{shard}.parquet"))
            lines += pq.read_table(local, columns=["text"]).column("text").to_pylist()
        with open(os.path.join(directory, f"wiki.{stem}.{config.suffix}"), "w", encoding="utf-8") as f:
            f.writelines((line or "").rstrip("\n") + "\n" for line in lines)  # one row a line
    return directory


def _from_zip(config, directory, template):
    archive = download(template.format(config=config.name), os.path.join(directory, f"{config.name}.zip"))
    with zipfile.ZipFile(archive) as zipped:
        for split, stem in SPLIT_FILES.items():
            name = f"{config.folder}/wiki.{stem}.{config.suffix}"
            with zipped.open(name) as src, open(os.path.join(directory, f"wiki.{stem}.{config.suffix}"), "wb") as dst:
                shutil.copyfileobj(src, dst)
    return directory


def count(path, tokens):
    """`(lines, tokens)` of a split file; tokens are words plus one end-of-line a line (or None)."""
    lines = words = 0
    with open(path, "rb") as f:
        for line in f:
            lines += 1
            if tokens:
                words += len(line.split())
    return lines, (words + lines if tokens else None)


def check_counts(config_name, paths, source):
    """Raises `ValueError` when a split's line or token count differs from the published one."""
    published = PUBLISHED_COUNTS[config_name]
    problems = []
    for split, path in paths.items():
        lines, tokens = count(path, "tokens" in published)
        if lines != published["lines"][split]:
            problems.append(f"{split}: {lines:,} lines, published {published['lines'][split]:,}")
        if tokens is not None and tokens != published["tokens"][split]:
            problems.append(f"{split}: {tokens:,} tokens, published {published['tokens'][split]:,}")
    if problems:
        raise ValueError(f"{source} served a {config_name} that is not the published one: " + "; ".join(problems))


def fetch_wikitext(config, directory):
    """Downloads `config` (a `WikitextConfig`) into `directory` from the first source that works.

    Returns:
        `(root, source)`: the directory holding the three split files, and the URL template used.

    Raises:
        DownloadError: every source failed or served other data; the message lists them all.
    """
    failures = []
    for name, template in SOURCES.items():
        target = os.path.join(directory, name, config.name)
        try:
            root = (_from_parquet if template.endswith(".parquet") else _from_zip)(config, target, template)
            paths = {split: os.path.join(root, f"wiki.{stem}.{config.suffix}") for split, stem in SPLIT_FILES.items()}
            check_counts(config.name, paths, f"{name} ({template.split('{')[0]})")
            return root, template
        except Exception as error:  # noqa: BLE001 - any failure moves on to the next source
            failures.append(f"- {name}: {type(error).__name__}: {error}")
            print(f"WikiText from {name} failed ({error}); trying the next source.", file=sys.stderr, flush=True)
    raise DownloadError(
        f"Could not download {config.name} from any source:\n"
        + "\n".join(failures)
        + "\nOffline, or behind a firewall: put wiki.train, wiki.valid and wiki.test files in a directory "
        "and pass it as --data-dir (or set ELITA_WIKITEXT_DIR)."
    )


def split_files(directory, config_name):
    """`{split: path}` of the three split files of variant `config_name` in `directory` (or its folder).

    Raises:
        ValueError: for an unknown variant.
        FileNotFoundError: naming the files expected, when any is missing.
    """
    if config_name not in VARIANTS:
        raise ValueError(f"Unknown WikiText config. Expected one of {CONFIG_NAMES}. Received: {config_name!r}")
    folder, suffix, _ = VARIANTS[config_name]
    names = {split: f"wiki.{stem}.{suffix}" for split, stem in SPLIT_FILES.items()}
    for root in [directory, os.path.join(directory, folder)]:
        paths = {split: os.path.join(root, name) for split, name in names.items()}
        if all(os.path.isfile(p) for p in paths.values()):
            return paths
    raise FileNotFoundError(
        f"WikiText data directory {directory!r} must hold {', '.join(names.values())} "
        f"(the {config_name} files, optionally inside {folder}/)."
    )
