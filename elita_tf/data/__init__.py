"""Text (WikiText, TFDS, your own files), SentencePiece, and the language-modelling tf.data pipeline.

Each name loads its module on first use (`elita_tf.lazy`).
"""

from elita_tf.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "load_corpus": "corpus",
        "CorpusSettings": "corpus_settings",
        "TextCorpus": "text_files",
        "sample_text": "tokenizer",
        "lm_dataset": "pipeline",
        "steps_per_epoch": "pipeline",
        "stream_dataset": "pipeline",
        "stream_steps_per_epoch": "pipeline",
        "train_sentencepiece": "tokenizer",
        "CONFIG_NAMES": "sources",
        "Wikitext": "wikitext",
        "load_wikitext": "wikitext",
        "split_files": "sources",
    },
)
