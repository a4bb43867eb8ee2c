"""A split tokenized once into flat files on disk, and read back a sequence at a time.

    (line, starts_document) --SentencePiece, in tf.data--> DIR/ids.bin              int32, every token in order
                                                          DIR/document_starts.bin  uint8, 1 at a document's first token
    sequence i of length W = tokens [i W, (i + 1) W): one positioned read of each file

This is how `elita-train` and `elita-evaluate` read every split. Training reads sequences in a
seeded order without holding the split: memory stays flat however large the corpus is, and any
sequence (so any batch, so a resumed step) is one read away. Files are written once per (text,
tokenizer) fingerprint under a cache directory (`$ELITA_CACHE_DIR`, else `~/.cache/elita-tf`) and reused by
every later run: another seed, architecture or sequence length. `index.json` records each
file's size and CRC-32; a file that fails them is written again from the text (`write_token_file`).
"""

import hashlib
import json
import os
import shutil
import sys
import tempfile
import zlib

import numpy as np

FORMAT = 3  # 2: checksums in index.json; 3: document_starts.bin
CACHE_ENV = "ELITA_CACHE_DIR"
_FILES = ("ids.bin", "document_starts.bin")
_BYTES_PER_TOKEN = {"ids.bin": 4, "document_starts.bin": 1}
_BLOCK = 1 << 24


def cache_root():
    """`$ELITA_CACHE_DIR/tokens`, else `~/.cache/elita-tf/tokens`."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "elita-tf")
    return os.path.join(root, "tokens")


class CorruptTokenFileError(ValueError):
    """A token file that is not the one `write_token_file` wrote: missing, cut short, or changed."""


def _crc32(fd, size):
    crc, offset = 0, 0
    while offset < size:
        block = os.pread(fd, min(_BLOCK, size - offset), offset)
        if not block:
            break
        crc, offset = zlib.crc32(block, crc), offset + len(block)
    return crc


class TokenFile:
    """The token files of one split: `len()` tokens, read by positioned reads, never loaded whole.

    Opening checks the files against the sizes and CRC-32 checksums `write_token_file` recorded
    in `index.json` (about a second for 2 GB), and keeps them open: a damaged cache is named
    before any token is read, and removing the cache while a run reads it changes nothing.

    Args:
        directory: a directory `write_token_file` wrote.

    Raises:
        CorruptTokenFileError: naming the directory, when a file is missing, damaged or of an
            older format.

    Example:
    >>> tokens = TokenFile("~/.cache/elita-tf/tokens/3f2a.../train")  # doctest: +SKIP
    >>> ids, starts = tokens.sequences([0, 7], 257)                     # doctest: +SKIP
    """

    def __init__(self, directory):
        self.directory = directory
        try:
            with open(os.path.join(directory, "index.json")) as f:
                self.index = json.load(f)
            tokens, checksums = self.index["tokens"], self.index["crc32"]
            if self.index["format"] != FORMAT or not isinstance(tokens, int) or tokens < 0:
                raise ValueError("format")
        except (OSError, ValueError, KeyError, TypeError):
            raise CorruptTokenFileError(f"The token cache {directory} has a missing or damaged index.json.") from None
        self._files = self._open()
        for name, fd in zip(_FILES, self._files):
            size = os.fstat(fd).st_size
            if size != tokens * _BYTES_PER_TOKEN[name]:
                self.close()
                raise CorruptTokenFileError(
                    f"The token cache {directory} is damaged: {name} holds {size} bytes, not the "
                    f"{tokens * _BYTES_PER_TOKEN[name]} of its {tokens} tokens."
                )
            if _crc32(fd, size) != checksums.get(name):
                self.close()
                raise CorruptTokenFileError(f"The token cache {directory} is damaged: {name} fails its checksum.")

    def __len__(self):
        return self.index["tokens"]

    def __getstate__(self):  # open files stay with the process that opened them
        return {"index": self.index, "directory": self.directory, "_files": None}

    def __del__(self):
        self.close()

    def _open(self):
        try:
            return tuple(os.open(os.path.join(self.directory, name), os.O_RDONLY) for name in _FILES)
        except OSError as error:
            raise CorruptTokenFileError(
                f"The token cache {self.directory} cannot be read: {error.strerror} ({error.filename})."
            ) from None

    def close(self, _close=os.close):  # bound at definition: `os` may be gone when the interpreter exits
        for fd in getattr(self, "_files", None) or ():
            _close(fd)
        self._files = None

    def read(self, start, length):
        """Tokens `[start, start + length)`: `(ids int32 [length], starts bool [length])`."""
        if self._files is None:
            self._files = self._open()
        ids, starts = self._files
        if start < 0 or start + length > len(self):
            raise ValueError(f"Tokens [{start}, {start + length}) are outside the file's {len(self)}.")
        id_bytes, start_bytes = os.pread(ids, 4 * length, 4 * start), os.pread(starts, length, start)
        if len(id_bytes) != 4 * length or len(start_bytes) != length:
            raise CorruptTokenFileError(f"The token cache {self.directory} was cut short while in use.")
        return (
            np.frombuffer(id_bytes, "<i4").astype(np.int32),
            np.frombuffer(start_bytes, np.uint8).astype(bool),
        )

    def stream(self):
        """All the split's tokens in order, as a carried state reads them: `(ids int32 [N], starts bool [N])`."""
        return self.read(0, len(self))

    def sequences(self, indices, length):
        """Sequences `indices` of `length` tokens: `(ids int32 [n, length], starts bool [n, length])`."""
        ids = np.empty((len(indices), length), np.int32)
        starts = np.empty((len(indices), length), bool)
        for row, index in enumerate(indices):
            ids[row], starts[row] = self.read(int(index) * length, length)
        return ids, starts

    def sequence_count(self, length):
        """Whole sequences of `length` tokens (the last partial one is dropped)."""
        return len(self) // length


class FileSequences:
    """The sequences of `length` tokens of a `TokenFile`, as `lm_dataset` reads them: `len()` and `rows(indices)`.

    Sequence `i` is tokens `[i * length, (i + 1) * length)`: the split's stream cut back to back, the last
    partial sequence dropped.
    """

    def __init__(self, tokens, length):
        self.tokens, self.length = tokens, length

    def __len__(self):
        return self.tokens.sequence_count(self.length)

    def rows(self, indices):
        """`(ids int32 [n, length], starts bool [n, length])` of sequences `indices`."""
        return self.tokens.sequences(indices, self.length)


def fingerprint(*parts):
    """A directory name for what decides the tokens: the text's and tokenizer's hashes, the split, the format."""
    return hashlib.sha256(json.dumps([FORMAT, *parts]).encode()).hexdigest()[:32]


def cached_token_file(lines, tokenizer, text_sha256, split, vocabulary_size=None, progress=None):
    """A split tokenized once into the cache, and read from there by training and evaluation alike: a `TokenFile`.

    Args:
        lines: `tf.data.Dataset` of `(line, starts_document)` pairs (`load_corpus(..., document_starts=True)`).
        tokenizer: the run's `ElitaTokenizer`; its SentencePiece model is part of the fingerprint.
        text_sha256: str, the SHA-256 of the text and of what split it (`load_corpus`'s `info["sha256"]`).
        split: str, the split's name.
        vocabulary_size, progress: as `write_token_file`'s.
    """
    proto_sha256 = hashlib.sha256(tokenizer.proto).hexdigest()
    directory = os.path.join(cache_root(), fingerprint(text_sha256, proto_sha256, split))
    return write_token_file(lines, tokenizer, directory, vocabulary_size, progress=progress)


def write_token_file(lines, tokenizer, directory, vocabulary_size=None, lines_per_batch=1024, progress=None):
    """Tokenizes a split into `directory` (written under a temporary name, then renamed): a `TokenFile`.

    Args:
        lines: `tf.data.Dataset` of `(line, starts_document)` pairs
            (`load_corpus(..., document_starts=True)`), or of lines alone
            (no document starts).
        tokenizer: the run's `ElitaTokenizer`.
        directory: where the files go; an existing one is reused when it passes its checks,
            else written again (with a line on stderr naming it).
        vocabulary_size: optional int: every id must be below it.
        lines_per_batch: lines tokenized together by one parallel call.
        progress: optional `f(tokens)` called after each batch.

    Raises:
        ValueError: for an empty split, or an id outside `[0, vocabulary_size)`.
    """
    import tensorflow as tf  # a reader of existing files needs no TensorFlow

    from elita_tf.data.pipeline import tokenized_lines

    if os.path.exists(directory):
        try:
            tokens = TokenFile(directory)
        except CorruptTokenFileError as error:  # the cache is ours: written again from the text
            print(f"{error} Writing it again.", file=sys.stderr, flush=True)
            shutil.rmtree(directory, ignore_errors=True)
        else:
            _check_ids(tokens.index["min_id"], tokens.index["max_id"], vocabulary_size)
            return tokens

    if not isinstance(lines.element_spec, tuple):
        lines = lines.map(lambda line: (line, tf.constant(False)))
    batches = tokenized_lines(lines, tokenizer, lines_per_batch)
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".writing-", dir=parent)
    try:
        count, low, high = 0, None, None
        checksums = dict.fromkeys(_FILES, 0)
        with (
            open(os.path.join(scratch, _FILES[0]), "wb") as ids_file,
            open(os.path.join(scratch, _FILES[1]), "wb") as starts_file,
        ):
            for ids, starts in batches.prefetch(tf.data.AUTOTUNE).as_numpy_iterator():
                if not len(ids):
                    continue
                low = int(ids.min()) if low is None else min(low, int(ids.min()))
                high = int(ids.max()) if high is None else max(high, int(ids.max()))
                _check_ids(low, high, vocabulary_size)
                for name, file, data in zip(
                    _FILES, (ids_file, starts_file), (ids.astype("<i4"), starts.astype(np.uint8))
                ):
                    data = data.tobytes()
                    file.write(data)
                    checksums[name] = zlib.crc32(data, checksums[name])
                count += len(ids)
                if progress is not None:
                    progress(len(ids))
        if count == 0:
            raise ValueError("The corpus is empty: it has no line to read.")
        index = {"format": FORMAT, "tokens": count, "min_id": low, "max_id": high, "crc32": checksums}
        with open(os.path.join(scratch, "index.json"), "w") as f:
            json.dump(index, f)
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
