"""LiteRT export for on-device decoding: a `prefill` and a `decode` signature over one flat state.

    elita-export --run-dir runs/compare/elita/seed-0 --format litert --output elita.tflite [--quantize int8]

Signatures (one sequence, batch 1):
- `prefill(token_ids int32 [1, T]) -> {"logits": float32 [1, V], **state}`
- `decode(token_ids int32 [1, 1], **state) -> {"logits": float32 [1, V], **state}`

`logits` are the next token's, after the last input token; they are NaN
where no next token is defined: after an empty prompt, and past a finite
buffer's `max_sequence_length` (a flatbuffer cannot raise). The state is
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

The file carries its model's identity as flatbuffer metadata (`IDENTITY_KEY`):
the architecture, the SentencePiece model's and the weights' SHA-256 and the
quantization, so scoring a file against a run it was not exported from is
an error (`read_identity`, `model_identity`).

Driving the interpreter (`pip install "elita-tf[litert]"`; `LiteRTModel` in `litert_model.py` does this):

    from ai_edge_litert.interpreter import Interpreter
    runner = Interpreter(model_path="elita.tflite")
    prefill, decode = runner.get_signature_runner("prefill"), runner.get_signature_runner("decode")
    out = prefill(token_ids=np.array([prompt], np.int32))
    for _ in range(20):
        token = int(out.pop("logits")[0].argmax())
        out = decode(token_ids=np.array([[token]], np.int32), **out)
"""

import hashlib
import json
import os

import keras
import numpy as np
import tensorflow as tf
from tensorflow.lite.tools import flatbuffer_utils

from elita_tf.export.settings import check_quantize
from elita_tf.models import ElitaBackbone
from elita_tf.models.architectures import upgrade_config

IDENTITY_KEY = "elita_tf_identity"  # the flatbuffer metadata entry that holds `model_identity`
# get_config() fields that are not the architecture.
_KERAS_FIELDS = ("name", "trainable", "dtype", "mixed_precision_policy")


def model_identity(causal_lm, quantize=None):
    """What a LiteRT file of `causal_lm` must match: architecture, tokenizer and weights fingerprints.

    The weights' digest is over their float32 values in order, so a
    mixed-precision model and its float32 copy share it.
    """
    backbone = causal_lm.backbone
    weights = hashlib.sha256()
    for weight in backbone.weights:
        weights.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight), dtype=np.float32).tobytes())
    preprocessor = causal_lm.preprocessor
    proto = None if preprocessor is None else preprocessor.tokenizer.proto
    architecture = {key: value for key, value in backbone.get_config().items() if key not in _KERAS_FIELDS}
    identity = {
        "architecture": architecture,
        "tokenizer_sha256": None if proto is None else hashlib.sha256(proto).hexdigest(),
        "weights_sha256": weights.hexdigest(),
        "quantize": quantize,
    }
    return json.loads(json.dumps(identity))  # as the file stores it (tuples as lists)


def _with_identity(flatbuffer, identity):
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    if any((buffer.offset or 0) > 1 for buffer in model.buffers):
        # Over 2 GB the converter stores weights after the flatbuffer, which rewriting it would drop.
        raise ValueError("LiteRT files over 2 GB are not supported: their weights live outside the flatbuffer.")
    buffer = flatbuffer_utils.schema_fb.BufferT()
    buffer.data = np.frombuffer(json.dumps(identity, sort_keys=True).encode(), np.uint8)
    model.buffers.append(buffer)
    entry = flatbuffer_utils.schema_fb.MetadataT()
    entry.name, entry.buffer = IDENTITY_KEY, len(model.buffers) - 1
    model.metadata = [*(model.metadata or []), entry]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def read_identity(path):
    """The `model_identity` dict a LiteRT file carries, or None for a file without one."""
    with open(path, "rb") as f:
        model = flatbuffer_utils.convert_bytearray_to_object(bytearray(f.read()))
    for entry in model.metadata or []:
        if entry.name.decode() == IDENTITY_KEY:
            return json.loads(bytes(model.buffers[entry.buffer].data).decode())
    return None


def check_identity(path, causal_lm):
    """Raises ValueError unless the LiteRT file at `path` was exported from `causal_lm`, naming what differs."""
    found = read_identity(path)
    if found is None:
        raise ValueError(f"{path} carries no elita-tf model identity: export it again with `elita-export`.")
    want = model_identity(causal_lm, found.get("quantize"))
    differs = []
    for key, value in want.items():
        if key == "architecture":
            theirs = upgrade_config(found.get(key) or {})  # a file exported by elita-tf 0.1.0: its names
            differs += [
                f"{name}={theirs.get(name)!r} (the run's: {value[name]!r})"
                for name in value
                if theirs.get(name) != value[name]
            ]
        elif found.get(key) != value:
            differs.append(f"{key}={found.get(key)!r} (the run's: {value!r})")
    if differs:
        raise ValueError(f"{path} was exported from another model. Received: {'; '.join(differs)}")


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
    """The `prefill` and `decode` functions of one backbone, as LiteRT signatures (see the module docstring).

    Args:
        backbone: an `ElitaBackbone`.
    """

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone
        self._weights = [(variable, tf.constant(variable.numpy())) for variable in backbone.variables]
        self._template = backbone.get_initial_cache(1)
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
            hidden, caches = self.backbone.hidden_states(token, cache=caches)
            logits = self.backbone.logits(hidden[:, -1:])[:, -1]
        limit = self.backbone.decode_limit
        if limit is not None:  # past the buffers: no defined next token
            logits = tf.where(caches["position"][:, None] > limit, float("nan"), logits)
        return logits, caches

    def _prefill(self, token_ids):
        # One recurrent step a token: the same state as the parallel form, in built-in ops.
        caches = self.backbone.get_initial_cache(1)
        logits = tf.fill([1, self.backbone.vocabulary_size], float("nan"))  # an empty prompt predicts nothing

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


def _float32(backbone):
    """`backbone`, computing in float32: a mixed-precision model's weights are float32 already, and its 16-bit
    casts are not among the ops LiteRT converts (`quantize="int8"` is the way to a smaller file)."""
    if backbone.compute_dtype == "float32":
        return backbone
    copy = ElitaBackbone.from_config({**backbone.get_config(), "dtype": "float32"})
    copy.set_weights(backbone.get_weights())
    return copy


def export_litert(causal_lm, path, quantize=None):
    """Writes `causal_lm` (an `ElitaCausalLM`) as a LiteRT flatbuffer with `prefill` and `decode` signatures.

    Args:
        causal_lm: an `ElitaCausalLM` (its backbone is what is converted; a mixed-precision
            backbone is converted in float32, its weights' own dtype).
        path: the `.tflite` file to write.
        quantize: None (float32 weights) or `"int8"` (int8 weights,
            dynamic-range quantization).

    Returns:
        `path`.

    Raises:
        ValueError: for another `quantize`, or a quantized `causal_lm` (`quantize("int8")`: the converter takes
            float weights and quantizes them itself).
    """
    check_quantize(quantize)
    modes = {layer.quantization_mode for layer in causal_lm.backbone._flatten_layers()} - {None}
    if modes:
        # Keras' int8 layers multiply int8 activations, which LiteRT's fully connected op does not take.
        raise ValueError(
            "export_litert takes a float model, and this one is quantized: export the float model (the preset or "
            f"run before `quantize`) with quantize='int8' (elita-export --quantize int8). Received: "
            f"quantization_mode={', '.join(sorted(modes))}"
        )
    decoder = OnDeviceDecoder(_float32(causal_lm.backbone))
    functions = [decoder.prefill.get_concrete_function(), decoder.decode.get_concrete_function()]
    converter = tf.lite.TFLiteConverter.from_concrete_functions(functions, decoder)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]  # no Flex: plain LiteRT runs it
    if quantize == "int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    flatbuffer = _with_identity(converter.convert(), model_identity(causal_lm, quantize))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(flatbuffer)
    return path
