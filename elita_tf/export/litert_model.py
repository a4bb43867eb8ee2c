"""`LiteRTModel`: a LiteRT file `export_litert` wrote, run by the `ai_edge_litert` interpreter.

    model = LiteRTModel("elita.tflite")          # pip install "elita-tf[litert]"
    model.generate([5, 9, 14], max_new_tokens=20)  # greedy token ids
    model.loss(windows)                           # mean next-token cross-entropy

It runs the file as a phone would: `prefill` on the prompt, then one `decode` call a token, each
fed the state the call before returned.
"""

import numpy as np


class LiteRTModel:
    """The `prefill` and `decode` signatures of a LiteRT file, with greedy generation and scoring.

    Args:
        path: a `.tflite` file written by `elita_tf.export.export_litert`.

    Raises:
        ImportError: without the `ai-edge-litert` interpreter.
        ValueError: for a file without the two signatures.
    """

    def __init__(self, path):
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            raise ImportError(
                'Running a LiteRT file needs the ai-edge-litert interpreter: pip install "elita-tf[litert]".'
            ) from None
        interpreter = Interpreter(model_path=path)
        signatures = interpreter.get_signature_list()
        if sorted(signatures) != ["decode", "prefill"]:
            raise ValueError(
                f"{path} is not an elita-tf LiteRT file: it needs the signatures prefill and decode. "
                f"Received: signatures={sorted(signatures)}"
            )
        self.path = path
        self.prefill = interpreter.get_signature_runner("prefill")
        self.decode = interpreter.get_signature_runner("decode")

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
            ValueError: for an empty prompt, or when prompt and new tokens pass
                the model's decoding limit (`ElitaBackbone.decode_limit`, None
                for constant-size states).
        """
        if not len(prompt):
            raise ValueError("The prompt is empty: prefill needs at least one token. Received: prompt=[]")
        state = self.prefill(token_ids=np.asarray([prompt], np.int32))
        tokens = []
        for _ in range(max_new_tokens):
            tokens.append(int(np.argmax(self._defined(state.pop("logits")[0], len(prompt) + len(tokens)))))
            if len(tokens) < max_new_tokens:
                state = self.decode(token_ids=np.asarray([tokens[-1:]], np.int32), **state)
        return tokens

    def loss(self, windows, progress=None):
        """Mean next-token cross-entropy over windows `[N, T + 1]`, each from an empty state.

        The first token is prefilled and every later one decoded, so each
        position is scored exactly as the Keras model scores the window in
        parallel. `progress`, if given, is called after each window.
        """
        total, count = 0.0, 0
        for window in np.asarray(windows, np.int32):
            state = self.prefill(token_ids=window[None, :1])
            for position in range(1, len(window)):
                logits = self._defined(state.pop("logits")[0], position).astype(np.float64)
                top = logits.max()
                total += top + np.log(np.exp(logits - top).sum()) - logits[window[position]]
                count += 1
                if position < len(window) - 1:
                    state = self.decode(token_ids=window[None, position : position + 1], **state)
            if progress is not None:
                progress()
        return total / count
