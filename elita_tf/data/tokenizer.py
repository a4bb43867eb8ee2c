"""SentencePiece, trained on the train split; `elita_tf.models.ElitaTokenizer` applies it (in the tf.data graph)."""

import collections
import io
import re

import numpy as np
import sentencepiece
import tensorflow as tf

from elita_tf.checks import MIN_BYTE_FALLBACK_VOCABULARY, check_byte_fallback_vocabulary, check_vocabulary_size

# SentencePiece's trainer skips a sentence longer than this many UTF-8 bytes (its own default,
# `max_sentence_length`); longer lines are cut into pieces for it (`cut_long_line`).
MAX_SENTENCE_BYTES = 4192
SPECIAL_PIECES = 3  # <unk>, <s> and </s>
BYTE_PIECES = 256  # byte fallback's <0x00> ... <0xFF>
# With byte fallback, the characters that cover this share of the text keep pieces of their own
# (SentencePiece's advice for languages with rich character sets), at most half the vocabulary's
# other pieces; the rarest ones are spelled in bytes.
FALLBACK_COVERAGE = 0.9995


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


def _train(text, vocabulary_size, model_type, seed, **options):
    """SentencePiece's trainer on `text` (a list of `str`), every character in the vocabulary."""
    model = io.BytesIO()
    sentencepiece.set_random_generator_seed(seed)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(text),
        model_writer=model,
        vocab_size=vocabulary_size,
        model_type=model_type,
        character_coverage=1.0,
        num_threads=1,
        max_sentence_length=MAX_SENTENCE_BYTES,
        minloglevel=2,
        **options,
    )
    return model.getvalue()


def _check_not_too_large(error, vocabulary_size):
    """Raises SentencePiece's "Vocabulary size too high ... <= 17." as a ValueError with the largest size."""
    too_large = re.search(r"Vocabulary size too high.*<= (\d+)", str(error))
    if too_large:
        raise ValueError(
            f"The corpus is too small for a vocabulary of {vocabulary_size} pieces: use at most "
            f"{too_large.group(1)}. Received: vocabulary_size={vocabulary_size}"
        ) from None


def common_characters_only(text, vocabulary_size):
    """`text` normalized as SentencePiece does, with its rarer characters made spaces, for byte fallback.

    The commonest characters that cover `FALLBACK_COVERAGE` of the text are kept, at most half of
    the pieces the special and byte pieces leave (the other half for longer pieces); the tokenizer
    trained on the result spells every other character in UTF-8 byte pieces.

    Args:
        text: list of `str`.
        vocabulary_size: int. The vocabulary to fit, at least `MIN_BYTE_FALLBACK_VOCABULARY`.

    Returns:
        list of `str`.
    """
    # The trainer's own normalization (NFKC and its whitespace rules), so that the characters counted
    # are the ones it counts; it normalizes the result again, which changes nothing.
    normalizer = sentencepiece.SentencePieceNormalizer(
        rule_name="nmt_nfkc", add_dummy_prefix=False, escape_whitespaces=False
    )
    text = normalizer.normalize(text)
    counts = collections.Counter()
    for line in text:
        counts.update(line)
    counts.pop(" ", None)  # the word boundary, a piece of its own whatever the vocabulary
    budget = max(1, (vocabulary_size - SPECIAL_PIECES - BYTE_PIECES) // 2)
    enough = FALLBACK_COVERAGE * sum(counts.values())
    ranked = sorted(counts, key=lambda char: (-counts[char], char))
    covered, kept = 0, 0
    while kept < min(budget, len(ranked)) and covered < enough:
        covered, kept = covered + counts[ranked[kept]], kept + 1
    spaces = str.maketrans(dict.fromkeys(ranked[kept:], " "))
    return [line.translate(spaces) for line in text]


def train_sentencepiece(lines, vocabulary_size=5000, model_type="unigram", seed=0, byte_fallback=False):
    """Trains a SentencePiece model on an iterable of text lines.

    Every character of the text gets a piece of its own when the vocabulary holds them all with the
    special pieces; a character the text never had is then `<unk>` (id 0, decoded as " ⁇ "). With
    `byte_fallback`, or when the vocabulary cannot hold every character, the tokenizer falls back
    on bytes (SentencePiece's `byte_fallback`, as Llama's and Gemma's tokenizers): it keeps the
    commonest characters (`common_characters_only`) and spells any other in its UTF-8 byte pieces,
    never `<unk>`. That needs `MIN_BYTE_FALLBACK_VOCABULARY` pieces.

    Either way a text decodes back as SentencePiece normalises it (its `nmt_nfkc` rule), not always
    byte for byte: NFKC forms are folded (`ﬁ` to `fi`), zero-width characters dropped, tabs and
    line breaks made spaces, runs of spaces made one, and spaces at either end removed.

    A line longer than SentencePiece takes (`MAX_SENTENCE_BYTES`) is cut into pieces it takes
    (`cut_long_line`) for training the tokenizer, which then tokenizes it whole like any other.

    Args:
        lines: iterable of `str` (or `bytes`), e.g. the train split.
        vocabulary_size: int. Pieces in the vocabulary. Defaults to `5000`.
        model_type: `"unigram"` or `"bpe"`. Defaults to `"unigram"`.
        seed: int. Fixes SentencePiece's sampling, for reproducible vocabularies.
        byte_fallback: bool. Byte pieces whatever the vocabulary holds. Defaults to `False`: only
            when the vocabulary cannot hold every character.

    Returns:
        The serialized model proto (`bytes`): save it with the run, pass it to
        `ElitaTokenizer(proto=...)`.

    Raises:
        ValueError: `vocabulary_size` is below the smallest SentencePiece trains
            (`elita_tf.checks.check_vocabulary_size`), the corpus is empty, too small
            for `vocabulary_size` (with the largest size it allows), or has more distinct characters than
            `vocabulary_size` holds and too few pieces for byte fallback (with the
            smallest size that works), or `byte_fallback` with fewer pieces than it needs.
    """
    check_vocabulary_size("vocabulary_size", vocabulary_size)
    text = [line.decode("utf-8") if isinstance(line, bytes) else line for line in lines]
    text = [piece for line in text if line.strip() for piece in cut_long_line(line)]
    if not text:
        raise ValueError("Cannot train a SentencePiece model: the corpus is empty.")
    if byte_fallback:
        check_byte_fallback_vocabulary("vocabulary_size", vocabulary_size)
    if not byte_fallback:
        try:
            return _train(text, vocabulary_size, model_type, seed)
        except RuntimeError as error:
            # SentencePiece's own words: "... smaller than required_chars. 10 vs 16." (the characters and
            # the special pieces) and "... <= 17."
            too_small = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(error))
            if too_small is None:
                _check_not_too_large(error, vocabulary_size)
                raise
            every_character = int(too_small.group(1))
    if vocabulary_size < MIN_BYTE_FALLBACK_VOCABULARY:  # the vocabulary holds neither every character nor bytes
        raise ValueError(
            f"A vocabulary of {vocabulary_size} pieces cannot hold every character of the corpus with the special "
            f"pieces ({every_character} pieces), nor the {BYTE_PIECES} byte pieces that spell rare characters "
            f"instead ({MIN_BYTE_FALLBACK_VOCABULARY} pieces at least): use at least "
            f"{min(every_character, MIN_BYTE_FALLBACK_VOCABULARY)}. Received: vocabulary_size={vocabulary_size}"
        )
    try:
        text = common_characters_only(text, vocabulary_size)
        return _train(text, vocabulary_size, model_type, seed, byte_fallback=True)
    except RuntimeError as error:
        _check_not_too_large(error, vocabulary_size)
        raise


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
