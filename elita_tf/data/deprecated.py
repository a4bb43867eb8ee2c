"""0.1.0's in-memory cutters, for one more release: each cuts its split the one way, through token files.

`elita_tf.data.token_sequences`, `token_stream` and `packed_sequences` (and 0.1.0's `token_windows` and
`packed_windows`) still give the arrays they gave, with a `FutureWarning` saying what does their work
(`renames.DEPRECATED`): the split's token files (`token_files.write_token_file`), written here to a temporary
directory, read back whole (`FileSequences(tokens, T + 1)` or `tokens.stream()`). `lm_dataset` takes their arrays
for the same release (`pipeline.ArraySequences`).
"""

import tempfile

import numpy as np

from elita_tf.checks import check_sequence_length
from elita_tf.data.token_files import FileSequences, write_token_file
from elita_tf.renames import accepts_renamed_arguments


def token_sequences(lines, tokenizer, sequence_length, vocabulary_size=None, lines_per_batch=1024):
    """All sequences of `sequence_length + 1` consecutive tokens of a split, in order: int32 `[N, T + 1]` (the last
    partial sequence dropped). Deprecated: `FileSequences(write_token_file(...), T + 1)`."""
    check_sequence_length("sequence_length", sequence_length)
    with tempfile.TemporaryDirectory() as directory:
        tokens = write_token_file(lines, tokenizer, f"{directory}/split", vocabulary_size, lines_per_batch)
        sequences = FileSequences(tokens, sequence_length + 1)
        if not len(sequences):
            raise ValueError(f"The corpus is shorter than one sequence of {sequence_length + 1} tokens.")
        ids, _ = sequences.rows(np.arange(len(sequences)))
        tokens.close()
    return ids


def token_stream(lines, tokenizer, vocabulary_size=None, lines_per_batch=1024):
    """A split as one stream: `(ids int32 [N], document_starts bool [N])`, True at the first token of each document's
    first line. Deprecated: `write_token_file(...).stream()`."""
    with tempfile.TemporaryDirectory() as directory:
        tokens = write_token_file(lines, tokenizer, f"{directory}/split", vocabulary_size, lines_per_batch)
        stream = tokens.stream()
        tokens.close()
    return stream


@accepts_renamed_arguments
def packed_sequences(ids, document_starts, sequence_length):
    """A stream (`token_stream`'s) cut into sequences of `sequence_length + 1` tokens, documents back to back:
    `(sequences int32, starts bool)`, each `[N // (T + 1), T + 1]`. Deprecated: `FileSequences(tokens, T + 1)` and
    `lm_dataset(..., document_starts=True)`."""
    check_sequence_length("sequence_length", sequence_length)
    count = len(ids) // (sequence_length + 1)
    if count == 0:
        raise ValueError(f"The corpus is shorter than one sequence of {sequence_length + 1} tokens.")
    cut = count * (sequence_length + 1)
    return ids[:cut].reshape(count, -1), document_starts[:cut].reshape(count, -1)
