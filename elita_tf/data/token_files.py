"""A split tokenized once into flat files on disk, and read back a window at a time.

    (line, starts_document) --SentencePiece, parallel in tf.data--> DIR/ids.bin     int32, every token in order
                                                                   DIR/starts.bin  uint8, 1 at a document's first token
    window i of length W = tokens [i W, (i + 1) W): one positioned read of each file

Training reads windows in a seeded order without holding the split: memory
stays flat however large the corpus is, and any window (so any batch, so a
resumed step) is one read away. The windows are those `token_windows` cuts
from the same stream, so a split read from its files trains exactly as it
did in memory. Files are written once per (text, tokenizer) fingerprint under
a cache directory (`$ELITA_CACHE_DIR`, else `~/.cache/elita-tf`) and reused by
every later run: another seed, architecture or sequence length.
"""

import hashlib
import json
import os
import shutil
import tempfile

import numpy as np

FORMAT = 1
CACHE_ENV = "ELITA_CACHE_DIR"


def cache_root():
    """`$ELITA_CACHE_DIR/tokens`, else `~/.cache/elita-tf/tokens`."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "elita-tf")
    return os.path.join(root, "tokens")


class TokenFile:
    """The token files of one split: `len()` tokens, read by positioned reads, never loaded whole.

    Args:
        directory: a directory `write_token_file` wrote.

    Example:
    >>> tokens = TokenFile("~/.cache/elita-tf/tokens/3f2a.../train")  # doctest: +SKIP
    >>> ids, starts = tokens.windows([0, 7], 257)                     # doctest: +SKIP
    """

    def __init__(self, directory):
        with open(os.path.join(directory, "index.json")) as f:
            self.index = json.load(f)
        self.directory = directory
        self._files = None

    def __len__(self):
        return self.index["tokens"]

    def __getstate__(self):  # open files stay with the process that opened them
        return {"index": self.index, "directory": self.directory, "_files": None}

    def _open(self):
        if self._files is None:
            self._files = tuple(os.open(os.path.join(self.directory, name), os.O_RDONLY) for name in _NAMES)
        return self._files

    def read(self, start, length):
        """Tokens `[start, start + length)`: `(ids int32 [length], starts bool [length])`."""
        ids, starts = self._open()
        if start < 0 or start + length > len(self):
            raise ValueError(f"Tokens [{start}, {start + length}) are outside the file's {len(self)}.")
        return (
            np.frombuffer(os.pread(ids, 4 * length, 4 * start), "<i4").astype(np.int32),
            np.frombuffer(os.pread(starts, length, start), np.uint8).astype(bool),
        )

    def windows(self, indices, length):
        """Windows `indices` of `length` tokens: `(ids int32 [n, length], starts bool [n, length])`."""
        ids = np.empty((len(indices), length), np.int32)
        starts = np.empty((len(indices), length), bool)
        for row, index in enumerate(indices):
            ids[row], starts[row] = self.read(int(index) * length, length)
        return ids, starts

    def window_count(self, length):
        """Whole windows of `length` tokens (the last partial one is dropped)."""
        return len(self) // length


_NAMES = ("ids.bin", "starts.bin")


class FileWindows:
    """The windows of `length` tokens of a `TokenFile`, as `lm_dataset` reads them: `len()` and `rows(indices)`.

    Window `i` is tokens `[i * length, (i + 1) * length)`, as `token_windows`
    cuts a split held in memory.
    """

    def __init__(self, tokens, length):
        self.tokens, self.length = tokens, length

    def __len__(self):
        return self.tokens.window_count(self.length)

    def rows(self, indices):
        """`(ids int32 [n, length], starts bool [n, length])` of windows `indices`."""
        return self.tokens.windows(indices, self.length)


def fingerprint(*parts):
    """A directory name for what decides the tokens: the text's and tokenizer's hashes, the split, the format."""
    return hashlib.sha256(json.dumps([FORMAT, *parts]).encode()).hexdigest()[:32]


def write_token_file(lines, tokenizer, directory, vocabulary_size=None, lines_per_batch=1024, progress=None):
    """Tokenizes a split into `directory` (written under a temporary name, then renamed): a `TokenFile`.

    Args:
        lines: `tf.data.Dataset` of `(line, starts_document)` pairs
            (`load_corpus(..., document_starts=True)`).
        tokenizer: a `tensorflow_text` tokenizer (`make_tokenizer`).
        directory: where the files go; an existing one is reused as it is.
        vocabulary_size: optional int: every id must be below it.
        lines_per_batch: lines tokenized together by one parallel call.
        progress: optional `f(tokens)` called after each batch.

    Raises:
        ValueError: for an empty split, or an id outside `[0, vocabulary_size)`.
    """
    import tensorflow as tf  # a reader of existing files needs no TensorFlow

    from elita_tf.data.pipeline import tokenized_lines

    if os.path.exists(os.path.join(directory, "index.json")):
        tokens = TokenFile(directory)
        _check_ids(tokens.index["min_id"], tokens.index["max_id"], vocabulary_size)
        return tokens

    batches = tokenized_lines(lines, tokenizer, lines_per_batch)
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".writing-", dir=parent)
    try:
        count, low, high = 0, None, None
        with (
            open(os.path.join(scratch, _NAMES[0]), "wb") as ids_file,
            open(os.path.join(scratch, _NAMES[1]), "wb") as starts_file,
        ):
            for ids, starts in batches.prefetch(tf.data.AUTOTUNE).as_numpy_iterator():
                if not len(ids):
                    continue
                low = int(ids.min()) if low is None else min(low, int(ids.min()))
                high = int(ids.max()) if high is None else max(high, int(ids.max()))
                _check_ids(low, high, vocabulary_size)
                ids_file.write(ids.astype("<i4").tobytes())
                starts_file.write(starts.astype(np.uint8).tobytes())
                count += len(ids)
                if progress is not None:
                    progress(len(ids))
        if count == 0:
            raise ValueError("The corpus is empty: it has no line to read.")
        with open(os.path.join(scratch, "index.json"), "w") as f:
            json.dump({"format": FORMAT, "tokens": count, "min_id": low, "max_id": high}, f)
        try:
            os.rename(scratch, directory)
        except OSError:  # written meanwhile by another process (a worker): theirs is the same
            if not os.path.exists(os.path.join(directory, "index.json")):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return TokenFile(directory)


def _check_ids(low, high, vocabulary_size):
    if vocabulary_size is not None and (low < 0 or high >= vocabulary_size):
        raise ValueError(
            f"The tokenizer produced ids in [{low}, {high}], outside the model's vocabulary "
            f"[0, {vocabulary_size}): its vocabulary is larger than the model's. "
            f"Received: vocabulary_size={vocabulary_size}"
        )
