"""`LiteRTModel`: a LiteRT file `export_litert` wrote, run by the `ai_edge_litert` interpreter.

    model = LiteRTModel("elita.tflite")          # pip install "elita-tf[litert]"
    model.generate([5, 9, 14], max_new_tokens=20)  # greedy token ids
    model.loss(sequences)                           # mean next-token cross-entropy, tokens scored

It runs the file as a phone would: `prefill` on the prompt, then one `decode` call a token, each
fed the state the call before returned.
"""

import os

import numpy as np

from elita_tf.renames import accepts_renamed_arguments


class LiteRTModel:
    """The `prefill` and `decode` signatures of a LiteRT file, with greedy generation and scoring.

    Args:
        path: a `.tflite` file written by `elita_tf.export.export_litert`.

    Attributes:
        vocabulary_size: int. The size of the file's vocabulary: its `logits`' last dimension.

    Raises:
        ImportError: without the `ai-edge-litert` interpreter.
        FileNotFoundError: for a path with no file.
        ValueError: for a file the interpreter cannot read (truncated or
            damaged), or one without the two signatures.
    """

    def __init__(self, path):
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            raise ImportError(
                'Running a LiteRT file needs the ai-edge-litert interpreter: pip install "elita-tf[litert]".'
            ) from None
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No LiteRT file at {path}. Received: path={path!r}")
        try:
            interpreter = Interpreter(model_path=path)
        except (ValueError, RuntimeError) as error:  # the interpreter's own words, e.g. "not a valid Flatbuffer"
            reason = " ".join(str(error).split())
            raise ValueError(f"{path} is not a complete LiteRT file (truncated or damaged?): {reason}") from None
        signatures = interpreter.get_signature_list()
        if sorted(signatures) != ["decode", "prefill"]:
            raise ValueError(
                f"{path} is not an elita-tf LiteRT file: it needs the signatures prefill and decode. "
                f"Received: signatures={sorted(signatures)}"
            )
        self.path = path
        self.prefill = interpreter.get_signature_runner("prefill")
        self.decode = interpreter.get_signature_runner("decode")
        self.vocabulary_size = int(self.prefill.get_output_details()["logits"]["shape"][-1])

    def _check_ids(self, token_ids, name):
        """`token_ids` as int32, or ValueError naming the first id outside `[0, vocabulary_size)` and its index.

        The interpreter would fail on it with a GATHER error, or (a negative
        id) return NaN logits, far from the id.
        """
        token_ids = np.asarray(token_ids)
        if token_ids.size and not np.issubdtype(token_ids.dtype, np.integer):
            raise ValueError(f"Token ids must be integers. Received: {name} of dtype {token_ids.dtype}")
        outside = np.argwhere((token_ids < 0) | (token_ids >= self.vocabulary_size))
        if len(outside):
            index = tuple(int(i) for i in outside[0])
            raise ValueError(
                f"Token ids must be in [0, vocabulary_size={self.vocabulary_size}). "
                f"Received: {name}[{', '.join(map(str, index))}]={token_ids[index]}"
            )
        return token_ids.astype(np.int32)

    @staticmethod
    def _defined(logits, tokens_read):
        # The file returns NaN logits where no next token is defined: it cannot raise.
        if np.isnan(logits).any():
            raise ValueError(
                "The LiteRT model has no next token after this input: it is past the buffers of its "
                f"max_sequence_length (ElitaBackbone.decode_limit). Received: {tokens_read} tokens"
            )
        return logits

    def generate(self, prompt, max_new_tokens):
        """Greedy continuation of one prompt (a list of token ids); a list of `max_new_tokens` ids.

        Raises:
            ValueError: for an empty prompt, an id outside the vocabulary, a
                negative or non-integer `max_new_tokens`, or when prompt and
                new tokens pass the model's decoding limit
                (`ElitaBackbone.decode_limit`, None for constant-size states).
        """
        if not len(prompt):
            raise ValueError("The prompt is empty: prefill needs at least one token. Received: prompt=[]")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
            raise ValueError(
                f"`max_new_tokens` must be a non-negative integer. Received: max_new_tokens={max_new_tokens!r}"
            )
        state = self.prefill(token_ids=self._check_ids(prompt, "prompt")[None])
        tokens = []
        for _ in range(max_new_tokens):
            tokens.append(int(np.argmax(self._defined(state.pop("logits")[0], len(prompt) + len(tokens)))))
            if len(tokens) < max_new_tokens:
                state = self.decode(token_ids=np.asarray([tokens[-1:]], np.int32), **state)
        return tokens

    @accepts_renamed_arguments
    def loss(self, sequences, progress=None, scored=None):
        """Mean next-token cross-entropy over sequences `[N, T + 1]`, each from an empty state.

        The first token is prefilled and every later one decoded, so each
        position is scored exactly as the Keras model scores the sequence in
        parallel. `scored [N, T]`, if given, is False on a sequence's padded end,
        which is neither read nor scored. `progress`, if given, is called after
        each sequence.

        Returns:
            `(mean loss, tokens scored)`.

        Raises:
            ValueError: for an id outside the vocabulary.
        """
        total, count = 0.0, 0
        sequences = self._check_ids(sequences, "sequences")
        for row, sequence in enumerate(sequences):
            end = len(sequence) if scored is None else 1 + int(np.sum(scored[row]))
            state = self.prefill(token_ids=sequence[None, :1])
            for position in range(1, end):
                logits = self._defined(state.pop("logits")[0], position).astype(np.float64)
                top = logits.max()
                total += top + np.log(np.exp(logits - top).sum()) - logits[sequence[position]]
                count += 1
                if position < end - 1:
                    state = self.decode(token_ids=sequence[None, position : position + 1], **state)
            if progress is not None:
                progress()
        return total / count, count
