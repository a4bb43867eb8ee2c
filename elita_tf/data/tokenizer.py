"""SentencePiece: trained on the train split, applied inside the tf.data graph by tensorflow-text."""

import io
import re

import numpy as np
import sentencepiece
import tensorflow as tf
import tensorflow_text


def train_sentencepiece(lines, vocabulary_size=5000, model_type="unigram", seed=0):
    """Trains a SentencePiece model on an iterable of text lines.

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
    text = [line for line in text if line.strip()]
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
        list of `str`.
    """

    def each(dataset):  # read a block at a time: a Python iteration per element costs ~0.3 ms
        for block in dataset.batch(4096).as_numpy_iterator():
            yield from block

    sample, size = [], 0
    for line in each(lines):  # the whole corpus, while it fits
        if size + len(line) > max_bytes:
            break
        sample.append(line.decode("utf-8"))
        size += len(line)
    else:
        return sample
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
    return sample


def make_tokenizer(model_proto, add_eos=True):
    """A `tensorflow_text.SentencepieceTokenizer` (int32 ids), usable inside `tf.data.Dataset.map`.

    With `add_eos` every line ends with the end-of-sentence id, as WikiText's
    `<eos>` per line.
    """
    return tensorflow_text.SentencepieceTokenizer(model=model_proto, out_type=tf.int32, add_eos=add_eos)
