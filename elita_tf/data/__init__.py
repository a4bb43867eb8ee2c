"""WikiText through tensorflow-datasets, SentencePiece, and the language-modelling tf.data pipeline."""

from elita_tf.data.pipeline import (
    lm_dataset,
    steps_per_epoch,
    stream_dataset,
    stream_steps_per_epoch,
    token_stream,
    token_windows,
)
from elita_tf.data.tokenizer import make_tokenizer, train_sentencepiece
from elita_tf.data.wikitext import CONFIG_NAMES, Wikitext, load_wikitext, split_files
