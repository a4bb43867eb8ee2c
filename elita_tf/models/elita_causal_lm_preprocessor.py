"""`ElitaCausalLMPreprocessor`: raw strings to `token_ids`, `padding_mask` and next-token labels."""

import keras
import keras_hub

from elita_tf.models.elita_backbone import ElitaBackbone
from elita_tf.models.elita_tokenizer import ElitaTokenizer


@keras.saving.register_keras_serializable(package="elita_tf")
class ElitaCausalLMPreprocessor(keras_hub.models.CausalLMPreprocessor):
    """keras-hub's causal LM preprocessing with `ElitaTokenizer`.

    Each string becomes a line of the training text: the end-of-line piece
    before it (`add_start_token`) and after it (`add_end_token`), padded on
    the right to `sequence_length`. For `generate`, only the piece before.

    Example:
    >>> preprocessor = ElitaCausalLMPreprocessor(tokenizer, sequence_length=64)  # doctest: +SKIP
    >>> x, y, sample_weight = preprocessor(["The cat sat on the mat ."])  # doctest: +SKIP
    """

    backbone_cls = ElitaBackbone
    tokenizer_cls = ElitaTokenizer
