"""The language-modelling `tf.data` pipeline.

    (line, starts_document) --SentencePiece, once--> token files --a sequence of T + 1 at a time-->
          ({"token_ids", "padding_mask"}, targets) --shuffled with a seed per epoch--> batches --> prefetch

`elita-train` and `elita-evaluate` tokenize each split once into files (`token_files.cached_token_file`)
and read them back a sequence at a time (`token_files.FileSequences`): `lm_dataset` turns those into
batches, where batch `k` of the training stream is a pure function of `(seed, k)`, so the same seed
gives the same batches and a resumed run starts exactly at its step (`lm_dataset(..., start_step=k)`).
With packed documents (`elita-train --pack-documents`) the files' document starts ride along and the
batches carry `document_starts` and weights; with a carried state (`--carry-state`) the split is one
stream, read in segments (`stream_dataset`).

To batch a split of your own, write its token files (`token_files.write_token_file`) and pass
`FileSequences(tokens, T + 1)` to `lm_dataset`: one way to cut a split, the same for every run.
Sequences you already hold in memory read the same way through `ArraySequences(ids, starts)`.
"""

import warnings

import numpy as np
import tensorflow as tf

from elita_tf.renames import ARRAY_SEQUENCES, accepts_renamed_arguments


def line_ids(tokenizer, lines):
    """Ragged int32 ids `[n, None]` of a batch of `n` lines, each followed by the end-of-line id, as the model
    reads text (WikiText's `<eos>` ends every line). `tokenizer` is an `ElitaTokenizer`. Runs in a `tf.data`
    map, a `tf.function` or eagerly."""
    if tf.executing_eagerly():  # keras-hub's tokenizer gives ragged tensors in a graph, Python lists eagerly
        return tf.function(line_ids)(tokenizer, lines)
    pieces = tokenizer.tokenize(lines)
    ends = tf.fill([tf.shape(lines)[0], 1], tf.constant(tokenizer.end_token_id, pieces.dtype))
    return tf.concat([pieces, tf.RaggedTensor.from_tensor(ends)], axis=1)


class ArraySequences:
    """Sequences you hold in memory, `ids` `[N, T + 1]` (and their document starts), read as `FileSequences` is.

    Example:
    >>> sequences = ArraySequences(np.arange(12, dtype=np.int32).reshape(3, 4))
    >>> len(sequences), sequences.length, sequences.rows([2])[0].tolist()
    (3, 4, [[8, 9, 10, 11]])
    """

    def __init__(self, ids, starts=None):
        self.ids, self.starts = ids, np.zeros(ids.shape, bool) if starts is None else starts
        self.length = ids.shape[1]

    def __len__(self):
        return len(self.ids)

    def rows(self, indices):
        """`(ids int32 [n, length], starts bool [n, length])` of sequences `indices`."""
        return self.ids[indices], self.starts[indices]


@accepts_renamed_arguments
def steps_per_epoch(sequences, batch_size):
    steps = len(sequences) // batch_size
    if steps == 0:
        raise ValueError(
            f"{len(sequences)} sequences make no full batch of {batch_size}: lower the batch size or sequence length."
        )
    return steps


@accepts_renamed_arguments
def lm_dataset(
    sequences, batch_size, seed=0, shuffle=True, epochs=1, start_step=0, shard=0, num_shards=1, document_starts=False
):
    """Batches of `({"token_ids": [B, T], "padding_mask": [B, T]}, targets [B, T])`, targets shifted by one.

    Epoch `e` visits the sequences in the order `stateless_shuffle(seed, e)`
    (or in order with `shuffle=False`); the last partial batch is dropped.
    With `num_shards > 1` this is one worker's part of that same stream:
    rows `[shard * B / n, (shard + 1) * B / n)` of every global batch, so the
    shards of a step together are the single-process batch of that step.

    Args:
        sequences: the split's sequences of `T + 1` tokens on disk
            (`token_files.FileSequences`) or in memory (`ArraySequences`),
            read a batch at a time: anything with `len()`, `length` (`T + 1`)
            and `rows(indices)` giving `(ids int32 [n, T + 1], starts bool
            [n, T + 1])`. (0.1.0's int array `[N, T + 1]`, with its starts as
            `document_starts`, works for one more release, with a warning.)
        batch_size: int.
        seed: int. Same seed, same batches.
        shuffle: bool.
        epochs: int, or None to repeat forever.
        start_step: int. The first batch (global step) to produce: resuming.
        shard: int in `[0, num_shards)`. Which part of each batch to produce.
        num_shards: int. Parts each global batch is cut into; must divide
            `batch_size`.
        document_starts: bool. Packed documents: the sequences' own starts
            ride along. The inputs then carry `document_starts` (the sequence's starts,
            and its first position), and a third element weighs each target:
            0 where the target starts a document, else 1.

    Returns:
        A `tf.data.Dataset`, prefetched.
    """
    if batch_size % num_shards or not 0 <= shard < num_shards:
        raise ValueError(
            f"The global batch must split evenly into {num_shards} shards, and the shard must be one of them. "
            f"Received: batch_size={batch_size}, shard={shard}, num_shards={num_shards}"
        )
    if isinstance(sequences, np.ndarray):  # 0.1.0's arrays, for one more release
        warnings.warn(ARRAY_SEQUENCES, FutureWarning, stacklevel=3)  # the caller's line, past the renames' wrapper
        packed = isinstance(document_starts, np.ndarray)
        sequences = ArraySequences(sequences, document_starts if packed else None)
        document_starts = packed
    rows_per_shard = batch_size // num_shards
    count = len(sequences)
    per_epoch = steps_per_epoch(sequences, batch_size)

    def rows(indices):  # a batch read from disk
        ids, sequence_starts = tf.numpy_function(sequences.rows, [indices], (tf.int32, tf.bool), stateful=False)
        ids.set_shape([None, sequences.length])
        sequence_starts.set_shape([None, sequences.length])
        return ids, sequence_starts if document_starts else None

    def batch(order, position):
        first = position * batch_size + shard * rows_per_shard
        ids, row_starts = rows(order[first : first + rows_per_shard])
        token_ids = ids[:, :-1]
        inputs = {"token_ids": token_ids, "padding_mask": tf.ones_like(token_ids)}
        if row_starts is None:
            return inputs, ids[:, 1:]
        # A sequence's first position starts what it holds, whatever came before it.
        inputs["document_starts"] = tf.concat([tf.ones_like(row_starts[:, :1]), row_starts[:, 1:-1]], axis=1)
        return inputs, ids[:, 1:], tf.cast(tf.logical_not(row_starts[:, 1:]), tf.float32)

    def epoch_batches(epoch):
        # The epoch's order once, then its batches: batch k of a run depends on (seed, k) alone.
        order = tf.range(count, dtype=tf.int64)
        if shuffle:
            order = tf.random.experimental.stateless_shuffle(order, seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
        first = tf.where(epoch == start_step // per_epoch, tf.constant(start_step % per_epoch, tf.int64), 0)
        positions = tf.data.Dataset.range(first, per_epoch)
        return positions.map(
            lambda position: batch(order, position), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )

    last_epoch = None if epochs is None else epochs
    if last_epoch is not None and start_step >= last_epoch * per_epoch:
        last_epoch = start_step // per_epoch  # nothing left: an empty stream
    epochs_left = tf.data.Dataset.range(start_step // per_epoch, last_epoch if last_epoch is not None else 2**62)
    return epochs_left.flat_map(epoch_batches).prefetch(tf.data.AUTOTUNE)


def tokenized_lines(lines, tokenizer, lines_per_batch=1024):
    """`(ids, starts)` blocks of `(line, starts_document)` pairs, tokenized by parallel calls, in order.

    `starts` is True at the first token of each line that starts a document.
    """

    def tokenize(text, starts):
        pieces = line_ids(tokenizer, text)
        lengths = pieces.row_lengths()
        first = tf.sequence_mask(tf.minimum(lengths, 1), tf.reduce_max(lengths))
        return pieces.flat_values, tf.RaggedTensor.from_tensor(first & starts[:, None], lengths=lengths).flat_values

    return lines.batch(lines_per_batch).map(tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def stream_steps_per_epoch(length, batch_size, sequence_length):
    """Steps of `stream_dataset` in one pass over a stream of `length` tokens."""
    steps = (length // batch_size - 1) // sequence_length
    if steps <= 0:
        raise ValueError(
            f"A stream of {length} tokens cut into {batch_size} rows holds no segment of {sequence_length + 1} tokens: "
            "lower the batch size or sequence length."
        )
    return steps


@accepts_renamed_arguments
def stream_dataset(ids, document_starts, batch_size, sequence_length, epochs=1, start_step=0):
    """Batches of consecutive segments of `batch_size` parallel streams, for training with carried state.

    The stream is cut into `batch_size` contiguous rows; step `k` of an epoch
    is the `k`-th segment of `sequence_length` tokens of every row, so the state a
    model carries from step `k` continues into step `k + 1`. Each epoch reads
    the rows again from their start, which is marked as a reset, as is every
    document start.

    Args:
        ids: int32 `[N]`, `document_starts`: bool `[N]`: a split's whole stream (`TokenFile.stream()`).
        batch_size: int `B`, the parallel rows.
        sequence_length: int `T`.
        epochs: int, or None to repeat forever.
        start_step: int. The first (global) step to produce: resuming.

    Returns:
        A `tf.data.Dataset` of `({"token_ids", "padding_mask", "document_starts"}, targets)`, each `[B, T]`, prefetched.
    """
    per_epoch = stream_steps_per_epoch(len(ids), batch_size, sequence_length)
    row_length = len(ids) // batch_size
    rows = tf.constant(ids[: batch_size * row_length].reshape(batch_size, row_length))
    row_document_starts = document_starts[: batch_size * row_length].reshape(batch_size, row_length).copy()
    row_document_starts[:, 0] = True  # a row's start begins a state, whatever it is
    row_document_starts = tf.constant(row_document_starts)
    end = None if epochs is None else epochs * per_epoch

    def batch(step):
        start = tf.cast(step % per_epoch, tf.int32) * sequence_length
        tokens = rows[:, start : start + sequence_length + 1]
        token_ids = tokens[:, :-1]
        inputs = {
            "token_ids": token_ids,
            "padding_mask": tf.ones_like(token_ids),
            "document_starts": row_document_starts[:, start : start + sequence_length],
        }
        return inputs, tokens[:, 1:]

    steps = tf.data.Dataset.range(start_step, end if end is not None else 2**62)
    return steps.map(batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)
