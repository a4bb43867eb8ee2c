"""`ElitaTokenizer`: the run's SentencePiece model as a keras-hub tokenizer."""

import keras
import keras_hub


@keras.saving.register_keras_serializable(package="elita_tf")
class ElitaTokenizer(keras_hub.tokenizers.SentencePieceTokenizer):
    """The SentencePiece tokenizer a run trained (`elita_tf.data.train_sentencepiece`), for keras-hub.

    The training text puts the end-of-sentence piece `</s>` after every line,
    so it both ends a line (`end_token`, where generation stops) and stands
    before the next (`start_token`: a prompt starts as a new line of text).
    Padding uses id 0 (`<unk>`), which the model never has to predict.

    Args:
        proto: the serialized SentencePiece model (`bytes`) or a path to it.

    Example:
    >>> tokenizer = ElitaTokenizer(proto="wikitext.model")  # doctest: +SKIP
    """

    def __init__(self, proto=None, **kwargs):
        self._add_special_token("</s>", "start_token")
        self._add_special_token("</s>", "end_token")
        self.pad_token_id = 0
        super().__init__(proto=proto, **kwargs)
