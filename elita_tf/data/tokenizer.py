"""SentencePiece: trained on the train split, applied inside the tf.data graph by tensorflow-text."""

import io
import re

import numpy as np
import sentencepiece
import tensorflow as tf
import tensorflow_text

# SentencePiece's trainer skips a sentence longer than this many UTF-8 bytes (its own default,
# `max_sentence_length`); longer lines are cut into pieces for it (`cut_long_line`).
MAX_SENTENCE_BYTES = 4192


def cut_long_line(line, max_bytes=MAX_SENTENCE_BYTES):
    """A line as pieces of at most `max_bytes` UTF-8 bytes each, cut at whitespace where there is some.

    A piece with no whitespace to cut at is cut at a character boundary, never inside a character.

    Args:
        line: str.
        max_bytes: int. The largest piece, in UTF-8 bytes. Defaults to `MAX_SENTENCE_BYTES`.

    Returns:
        list of `str`: `[line]` itself when it fits.
    """
    if len(line) * 4 <= max_bytes:  # at most 4 bytes a character: fits, without encoding it
        return [line]
    data = line.encode("utf-8")
    pieces = []
    while len(data) > max_bytes:
        cut = max(data.rfind(b" ", 1, max_bytes + 1), data.rfind(b"\t", 1, max_bytes + 1))
        if cut > 0:
            piece, data = data[:cut], data[cut + 1 :]
        else:
            cut = max_bytes
            while data[cut] & 0xC0 == 0x80:  # a continuation byte: the character began before it
                cut -= 1
            piece, data = data[:cut], data[cut:]
        pieces.append(piece.decode("utf-8"))
    pieces.append(data.decode("utf-8"))
    return [piece for piece in pieces if piece.strip()]


def train_sentencepiece(lines, vocabulary_size=5000, model_type="unigram", seed=0):
    """Trains a SentencePiece model on an iterable of text lines.

    A line longer than SentencePiece takes (`MAX_SENTENCE_BYTES`) is cut into pieces it takes
    (`cut_long_line`) for training the tokenizer, which then tokenizes it whole like any other.

    Args:
        lines: iterable of `str` (or `bytes`), e.g. the train split.
        vocabulary_size: int. Pieces in the vocabulary. Defaults to `5000`.
        model_type: `"unigram"` or `"bpe"`. Defaults to `"unigram"`.
        seed: int. Fixes SentencePiece's sampling, for reproducible vocabularies.

    Returns:
        The serialized model proto (`bytes`): save it with the run, pass it to
        `make_tokenizer`.

    Raises:
        ValueError: the corpus is empty, too small for `vocabulary_size` (with the
            largest size it allows), or has more distinct characters than
            `vocabulary_size` holds (with the smallest size it needs).
    """
    text = [line.decode("utf-8") if isinstance(line, bytes) else line for line in lines]
    text = [piece for line in text if line.strip() for piece in cut_long_line(line)]
    if not text:
        raise ValueError("Cannot train a SentencePiece model: the corpus is empty.")
    model = io.BytesIO()
    sentencepiece.set_random_generator_seed(seed)
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(text),
            model_writer=model,
            vocab_size=vocabulary_size,
            model_type=model_type,
            character_coverage=1.0,
            num_threads=1,
            max_sentence_length=MAX_SENTENCE_BYTES,
            minloglevel=2,
        )
    except RuntimeError as error:
        # SentencePiece's own words: "... smaller than required_chars. 10 vs 16." and "... <= 17."
        too_small = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(error))
        too_large = re.search(r"Vocabulary size too high.*<= (\d+)", str(error))
        if too_small:
            raise ValueError(
                f"A vocabulary of {vocabulary_size} pieces cannot hold every character of the corpus with the "
                f"special pieces: use at least {too_small.group(1)}. Received: vocabulary_size={vocabulary_size}"
            ) from None
        if too_large:
            raise ValueError(
                f"The corpus is too small for a vocabulary of {vocabulary_size} pieces: use at most "
                f"{too_large.group(1)}. Received: vocabulary_size={vocabulary_size}"
            ) from None
        raise
    return model.getvalue()


def sample_text(lines, max_bytes, seed=0):
    """A seeded sample of at most `max_bytes` of text from a dataset of lines, to train a tokenizer on.

    A corpus that fits in `max_bytes` is returned whole, in order, read once. A larger one is read
    again, never held: once to measure it, once keeping each line with probability `max_bytes / total`.

    Args:
        lines: `tf.data.Dataset` of `tf.string` lines.
        max_bytes: int. The sample's size bound, in UTF-8 bytes.
        seed: int. Which lines are kept. Defaults to `0`.

    Returns:
        list of `str`: empty only for an empty corpus.

    Raises:
        ValueError: when the sample holds no line (the corpus's first line alone is larger than
            `max_bytes` and no smaller one was drawn), with the size of that first line.
    """

    def each(dataset):  # read a block at a time: a Python iteration per element costs ~0.3 ms
        for block in dataset.batch(4096).as_numpy_iterator():
            yield from block

    head, size = [], 0
    for line in each(lines):  # the whole corpus, while it fits
        if size + len(line) > max_bytes:
            stopped = len(line)
            break
        head.append(line.decode("utf-8"))
        size += len(line)
    else:
        return head
    sizes = lines.map(lambda line: tf.cast(tf.strings.length(line), tf.int64))
    keep = max_bytes / int(sizes.reduce(tf.constant(0, tf.int64), tf.add))
    rng = np.random.default_rng(seed)
    sample, size = [], 0
    for line in each(lines):
        if rng.random() >= keep:
            continue
        if size + len(line) > max_bytes:
            break
        sample.append(line.decode("utf-8"))
        size += len(line)
    if sample or head:  # a draw that kept no line that fits falls back on the corpus's first lines
        return sample or head
    raise ValueError(
        f"The tokenizer's sample of at most {max_bytes} bytes holds no line of the corpus: its first line alone "
        f"has {stopped} bytes. Raise tokenizer_sample_bytes (--tokenizer-sample-bytes). Received: max_bytes={max_bytes}"
    )


def make_tokenizer(model_proto, add_eos=True):
    """A `tensorflow_text.SentencepieceTokenizer` (int32 ids), usable inside `tf.data.Dataset.map`.

    With `add_eos` every line ends with the end-of-sentence id, as WikiText's
    `<eos>` per line.
    """
    return tensorflow_text.SentencepieceTokenizer(model=model_proto, out_type=tf.int32, add_eos=add_eos)
