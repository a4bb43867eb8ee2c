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

    def unknown_characters(self, texts):
        """The characters of `texts` that the vocabulary cannot spell: each becomes `<unk>`, decoded as " ⁇ ".

        A tokenizer with byte pieces (`train_sentencepiece(byte_fallback=True)`) spells every
        character and returns none. Characters that SentencePiece's normalisation removes or folds
        into known ones are not listed.

        Args:
            texts: a list of `str`.

        Returns:
            list of `str`, the characters in their order of first appearance.
        """
        characters = list(dict.fromkeys("".join(texts)))
        unknown = self.token_to_id("<unk>")
        ids = self(characters) if characters else []
        ids = ids.to_list() if hasattr(ids, "to_list") else ids
        return [char for char, row in zip(characters, ids) if unknown in row]

