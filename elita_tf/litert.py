"""LiteRT export for on-device decoding: a `prefill` and a `decode` signature over one flat state.

    elita-export --run-dir runs/compare/elita/seed-0 --format litert --output elita.tflite [--quantize int8]

Signatures (one sequence, batch 1):
- `prefill(token_ids int32 [1, T]) -> {"logits": float32 [1, V], **state}`
- `decode(token_ids int32 [1, 1], **state) -> {"logits": float32 [1, V], **state}`

`logits` are the next token's, after the last input token. The state is
every block's decoding cache flattened into named tensors (`block_0_log_z`,
`block_0_mean`, ..., `position`): the same names and shapes in prefill's
outputs, decode's inputs and decode's outputs, so a caller feeds each
step's state into the next. For ELiTA, linear and global additive attention
it is a constant size whatever the context; windowed layers hold a ring
buffer of their window; softmax blocks (transformer, simplified) and 3Lin
hold `max_sequence_length` positions, past which decoding is not defined.

The file uses LiteRT's built-in ops only (no Flex), so the plain
`ai_edge_litert` interpreter runs it: the parallel kernels need
`cumulative_logsumexp`, which LiteRT has only as a Flex op, so `prefill` runs
every layer's one-step (recurrent) form in a loop, which gives the same
state. `quantize="int8"` stores the weights as int8 (the converter's
dynamic-range quantization); activations and the state stay float32.

Driving the interpreter (`pip install "elita-tf[litert]"`; `litert_generate` does this):

    from ai_edge_litert.interpreter import Interpreter
    runner = Interpreter(model_path="elita.tflite")
    prefill, decode = runner.get_signature_runner("prefill"), runner.get_signature_runner("decode")
    out = prefill(token_ids=np.array([prompt], np.int32))
    for _ in range(20):
        token = int(out.pop("logits")[0].argmax())
        out = decode(token_ids=np.array([[token]], np.int32), **out)
"""

import os

import keras
import numpy as np
import tensorflow as tf

from elita_tf.generation import empty_caches, forward_with_cache
from elita_tf.models.config import DecoderConfig

QUANTIZATIONS = (None, "int8")


def flatten_state(caches):
    """`{name: tensor}` of a decoding cache: `block_{i}_{entry}` for each named entry of block i, and `position`."""
    flat = {"position": caches["position"]}
    for name, cache in caches.items():
        if name != "position":
            flat.update({f"{name}_{entry}": tensor for entry, tensor in cache.items()})
    return flat


def unflatten_state(flat, template):
    """The cache `flatten_state` flattened, in the structure of `template` (another cache of the model)."""
    caches = {"position": flat["position"]}
    for name, cache in template.items():
        if name != "position":
            caches[name] = {entry: flat[f"{name}_{entry}"] for entry in cache}
    return caches


class OnDeviceDecoder(tf.Module):
    """The `prefill` and `decode` functions of one model, as LiteRT signatures (see the module docstring).

    Args:
        model: a model from `build_decoder` (or loaded from `.keras`).
        config: its `DecoderConfig` (or the dict).
    """

    def __init__(self, model, config):
        super().__init__()
        self.model = model
        self.config = DecoderConfig.from_config(config) if isinstance(config, dict) else config
        self._layers = {layer.name: layer for layer in model.layers}
        self._weights = [(variable, tf.constant(variable.numpy())) for variable in model.variables]
        self._template = empty_caches(self.config, self._layers, 1)
        self.state_spec = {
            name: tf.TensorSpec(tensor.shape, tensor.dtype, name=name)
            for name, tensor in flatten_state(self._template).items()
        }

        # The converter names each signature after its function.
        def prefill(token_ids):
            return self._prefill(token_ids)

        def decode(token_ids, state):
            return self._decode(token_ids, state)

        self.prefill = tf.function(prefill, input_signature=[tf.TensorSpec([1, None], tf.int32, "token_ids")])
        self.decode = tf.function(
            decode, input_signature=[tf.TensorSpec([1, 1], tf.int32, "token_ids"), self.state_spec]
        )

    def _step(self, token, caches):
        # The weights enter as constants: variable reads would stay resource variables in the
        # flatbuffer, which the interpreter never initialises.
        with keras.StatelessScope(state_mapping=self._weights):
            logits, caches = forward_with_cache(self.config, self._layers, token, caches)
        return tf.cast(logits[:, -1], tf.float32), caches

    def _prefill(self, token_ids):
        # One recurrent step a token: the same state as the parallel form, in built-in ops.
        caches = empty_caches(self.config, self._layers, 1)
        logits = tf.zeros([1, self.config.vocab_size], tf.float32)

        def body(index, logits, caches):
            token = tf.reshape(tf.gather(token_ids, index, axis=1), [1, 1])  # static: the one-step form
            logits, caches = self._step(token, caches)
            return index + 1, logits, caches

        _, logits, caches = tf.while_loop(
            lambda index, *_: index < tf.shape(token_ids)[1], body, (tf.constant(0), logits, caches)
        )
        return {"logits": logits, **flatten_state(caches)}

    def _decode(self, token_ids, state):
        logits, caches = self._step(token_ids, unflatten_state(state, self._template))
        return {"logits": logits, **flatten_state(caches)}


def export_litert(model, config, path, quantize=None):
    """Writes `model` as a LiteRT flatbuffer with `prefill` and `decode` signatures; returns `path`.

    Args:
        model: a model from `build_decoder` (or loaded from `.keras`).
        config: its `DecoderConfig` (or the dict).
        path: the `.tflite` file to write.
        quantize: None (float32 weights) or `"int8"` (int8 weights,
            dynamic-range quantization).

    Raises:
        ValueError: for another `quantize`.
    """
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"`quantize` must be one of {QUANTIZATIONS}. Received: quantize={quantize!r}")
    decoder = OnDeviceDecoder(model, config)
    functions = [decoder.prefill.get_concrete_function(), decoder.decode.get_concrete_function()]
    converter = tf.lite.TFLiteConverter.from_concrete_functions(functions, decoder)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]  # no Flex: plain LiteRT runs it
    if quantize == "int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    flatbuffer = converter.convert()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(flatbuffer)
    return path


def litert_signatures(path):
    """`(prefill, decode)` signature runners of a file `export_litert` wrote, in `ai_edge_litert`'s interpreter."""
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
    return interpreter.get_signature_runner("prefill"), interpreter.get_signature_runner("decode")


def litert_generate(path, prompt, max_new_tokens):
    """Greedy continuation of one prompt (a list of token ids) through a LiteRT file; a list of ids.

    The caller keeps prompt + new tokens within the model's decoding limit
    (`DecoderConfig.decode_limit`, None for constant-size states): a
    flatbuffer cannot raise, and past its buffers the output is undefined.
    """
    if not len(prompt):
        raise ValueError("The prompt is empty: prefill needs at least one token. Received: prompt=[]")
    prefill, decode = litert_signatures(path)
    state = prefill(token_ids=np.asarray([prompt], np.int32))
    tokens = []
    for _ in range(max_new_tokens):
        tokens.append(int(np.argmax(state.pop("logits")[0])))
        if len(tokens) < max_new_tokens:
            state = decode(token_ids=np.asarray([tokens[-1:]], np.int32), **state)
    return tokens


def litert_loss(path, windows, progress=None):
    """Mean next-token cross-entropy of a LiteRT file over windows `[N, T + 1]`, each from an empty state.

    The first token is prefilled and every later one decoded, so each
    position is scored exactly as the Keras model scores the window in
    parallel. `progress`, if given, is called after each window.
    """
    prefill, decode = litert_signatures(path)
    total, count = 0.0, 0
    for window in np.asarray(windows, np.int32):
        state = prefill(token_ids=window[None, :1])
        for position in range(1, len(window)):
            logits = state.pop("logits")[0].astype(np.float64)
            top = logits.max()
            total += top + np.log(np.exp(logits - top).sum()) - logits[window[position]]
            count += 1
            if position < len(window) - 1:
                state = decode(token_ids=window[None, position : position + 1], **state)
        if progress is not None:
            progress()
    return total / count
