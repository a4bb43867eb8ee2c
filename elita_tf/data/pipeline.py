"""The language-modelling `tf.data` pipeline.

    lines --SentencePiece (in graph)--> ids --concatenate--> windows of T + 1
          --(inputs, targets)--> shuffled with a seed per epoch --> batches --> prefetch

Tokenising and cutting run once through `tf.data` (`token_windows`); the
windows are small (WikiText-2 at T = 256 is ~13K of them), so they are held
in memory, and batch `k` of the training stream is a pure function of
`(seed, k)`: the same seed gives the same batches, and a resumed run starts
exactly at its step (`lm_dataset(..., start_step=k)`).
"""

import numpy as np
import tensorflow as tf


def token_windows(lines, tokenizer, seq_len, vocabulary_size=None, lines_per_batch=1024):
    """All windows of `seq_len + 1` consecutive tokens of a split, in order.

    Args:
        lines: `tf.data.Dataset` of `tf.string` lines.
        tokenizer: a `tensorflow_text` tokenizer (`make_tokenizer`).
        seq_len: int `T >= 2`, the model's input length.
        vocabulary_size: optional int, the model's: every id must be below it
            (a tokenizer with more pieces than the model would feed it ids it
            has no row for).

    Returns:
        int32 numpy array `[N, T + 1]` (the last partial window is dropped).

    Raises:
        ValueError: for `seq_len < 2`, a corpus shorter than one window, or an
            id outside `[0, vocabulary_size)`.
    """
    if not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"The sequence length must be an integer >= 2. Received: seq_len={seq_len!r}")
    ids = lines.batch(lines_per_batch).map(lambda text: tokenizer.tokenize(text).flat_values).unbatch()
    windows = ids.batch(seq_len + 1, drop_remainder=True).batch(4096)
    chunks = list(windows.as_numpy_iterator())
    if not chunks:
        raise ValueError(f"The corpus is shorter than one window of {seq_len + 1} tokens.")
    windows = np.concatenate(chunks).astype(np.int32)
    if vocabulary_size is not None and (windows.min() < 0 or windows.max() >= vocabulary_size):
        raise ValueError(
            f"The tokenizer produced ids in [{windows.min()}, {windows.max()}], outside the model's vocabulary "
            f"[0, {vocabulary_size}): its vocabulary is larger than the model's. "
            f"Received: vocabulary_size={vocabulary_size}"
        )
    return windows


def steps_per_epoch(windows, batch_size):
    steps = len(windows) // batch_size
    if steps == 0:
        raise ValueError(
            f"{len(windows)} windows make no full batch of {batch_size}: lower the batch size or sequence length."
        )
    return steps


def lm_dataset(windows, batch_size, seed=0, shuffle=True, epochs=1, start_step=0, shard=0, num_shards=1):
    """Batches of `(inputs [B, T], targets [B, T])`, targets shifted by one.

    Epoch `e` visits the windows in the order `stateless_shuffle(seed, e)`
    (or in order with `shuffle=False`); the last partial batch is dropped.
    With `num_shards > 1` this is one worker's part of that same stream:
    rows `[shard * B / n, (shard + 1) * B / n)` of every global batch, so the
    shards of a step together are the single-process batch of that step.

    Args:
        windows: int array `[N, T + 1]` from `token_windows`.
        batch_size: int.
        seed: int. Same seed, same batches.
        shuffle: bool.
        epochs: int, or None to repeat forever.
        start_step: int. The first batch (global step) to produce: resuming.
        shard: int in `[0, num_shards)`. Which part of each batch to produce.
        num_shards: int. Parts each global batch is cut into; must divide
            `batch_size`.

    Returns:
        A `tf.data.Dataset`, prefetched.
    """
    if batch_size % num_shards or not 0 <= shard < num_shards:
        raise ValueError(
            f"The global batch must split evenly into {num_shards} shards, and the shard must be one of them. "
            f"Received: batch_size={batch_size}, shard={shard}, num_shards={num_shards}"
        )
    rows_per_shard = batch_size // num_shards
    count = len(windows)
    per_epoch = steps_per_epoch(windows, batch_size)
    table = tf.constant(windows)
    end = None if epochs is None else epochs * per_epoch

    def batch(step):
        epoch, position = step // per_epoch, step % per_epoch
        order = tf.range(count, dtype=tf.int64)
        if shuffle:
            order = tf.random.experimental.stateless_shuffle(order, seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
        first = position * batch_size + shard * rows_per_shard
        rows = tf.gather(table, order[first : first + rows_per_shard])
        return rows[:, :-1], rows[:, 1:]

    steps = tf.data.Dataset.range(start_step, end) if end is not None else tf.data.Dataset.range(start_step, 2**62)
    return steps.map(batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)
