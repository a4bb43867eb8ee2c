"""Model parallelism: where each weight of an `ElitaBackbone` is cut along a device mesh's model axis.

The cut is Megatron's (Shoeybi et al. 2019): a projection into heads or hidden features is cut along its
outputs (the heads, where the layer has heads), the projection back to the width along its inputs, so
that each device computes its own heads and features and the partial sums meet once per block part.
The token table and the output head are cut along the vocabulary, so no device holds a whole
`[B, T, V]` of logits. Norms, gains, positions, the short convolution and the biases of the width stay
whole on every device. XLA inserts the collectives (GSPMD); the data axis cuts the batch only.

    mesh = keras.distribution.DeviceMesh((2, 2), ("batch", "model"), keras.distribution.list_devices())
    layout_map = ElitaBackbone.get_layout_map(mesh, config=architecture_config("elita", vocabulary_size=5000))
    with keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch").scope():
        model = ElitaCausalLM(ElitaBackbone.from_architecture("elita", vocabulary_size=5000))

A layer's weight paths (`variable.path`) are `block_{i}/mixer/...`, `block_{i}/ffn/...`, and
the model's own (`token_embedding/embeddings`, `logits/kernel`, ...); the same path holds another shape
in another block type (ELiTA's value kernel is `[H, d, D]`, linear attention's `[d, H, D]`), so the
map names every block by its index.
"""

import keras

from elita_tf.checks import fail
from elita_tf.layers.tri_linear_attention import COMBINER_REP
from elita_tf.models.decoder_layers import three_lin_dims

_MODEL = "model"  # in the rules below: the model axis, whatever the mesh names it


def _heads(config):
    return "num_heads", config["num_heads"]


def _width(config):
    return "hidden_dim", config["hidden_dim"]


def _query_dim(config):
    return "3Lin's query width (hidden_dim // 2, at least 16)", three_lin_dims(config["hidden_dim"])[0]


def _combiner_inputs(config):
    return "3Lin's combiner input (16 times its low rank)", COMBINER_REP * three_lin_dims(config["hidden_dim"])[1]


def _intermediate(default):
    def size(config):
        return "intermediate_dim", config["intermediate_dim"] or default(config)

    return size


# Each block type's mixer: (path under `block_{i}/`, the axes of the weight, what the cut axis counts).
_MIXERS = {
    "elita": [
        (r"mixer/(value|output)/kernel", (_MODEL, None, None), _heads),
        (r"mixer/(a1|a2|b1|b2|c|k1/kernel|k2/kernel|k3/kernel)", (_MODEL, None), _heads),
    ],
    "transformer": [
        (r"mixer/attention/(query|key|value)/kernel", (None, _MODEL, None), _heads),
        (r"mixer/attention/(query|key|value)/bias", (_MODEL, None), _heads),
        (r"mixer/attention/attention_output/kernel", (_MODEL, None, None), _heads),
    ],
    "linear": [
        (r"mixer/(query|key|value)/kernel", (None, _MODEL, None), _heads),
        (r"mixer/(query|key|value)/bias", (_MODEL, None), _heads),
        (r"mixer/output/kernel", (_MODEL, None, None), _heads),
    ],
    "simplified": [
        (r"mixer/(query|key)/kernel", (None, _MODEL, None), _heads),
        (r"mixer/(query|key)/bias", (_MODEL, None), _heads),
        (r"mixer/(alpha|beta|gamma)", (_MODEL,), _heads),
        (r"mixer/value/kernel", (None, _MODEL), _width),  # the first block's value projection, [d, d]
    ],
    "additive": [  # the heads are groups of the width's features
        (r"mixer/(query|key|value)/kernel", (None, _MODEL), _width),
        (r"mixer/(query|key)_pooling", (_MODEL,), _width),
        (r"mixer/output/kernel", (_MODEL, None), _width),
    ],
    "3lin": [
        (r"mixer/(query_key|query_value)/kernel", (None, _MODEL), _query_dim),
        (r"mixer/combiner/kernel", (_MODEL, None), _combiner_inputs),
    ],
}
_FEED_FORWARD = [  # FeedForward ("mlp", and the One Wide FFN): inner [d, I], outer [I, d]
    (r"inner/kernel", (None, _MODEL)),
    (r"inner/bias", (_MODEL,)),
    (r"outer/kernel", (_MODEL, None)),
]
_FEEDFORWARD2 = [  # w1 [d, a] and w3 [a, b, d] along `a`; w2 [d, b] (b = 8) whole
    (r"w1/kernel", (None, _MODEL)),
    (r"w1/bias", (_MODEL,)),
    (r"w3/kernel", (_MODEL, None, None)),
]
_VOCABULARY = [
    ("token_embedding/embeddings", (_MODEL, None)),
    ("logits/kernel", (None, _MODEL)),
    ("logits/bias", (_MODEL,)),
]


def layout_map(device_mesh, config, model_parallel_dim_name="model", data_parallel_dim_name="batch"):
    """The `keras.distribution.LayoutMap` of a backbone of `config` (`check_architecture`'s, one block type a layer).

    Raises `ValueError` in one line when the model axis does not divide a size it cuts (the heads, the
    vocabulary, a hidden width), or when the mesh lacks an axis named.
    """
    if not isinstance(device_mesh, keras.distribution.DeviceMesh):
        fail("device_mesh", device_mesh, "a keras.distribution.DeviceMesh")
    for name in (model_parallel_dim_name, data_parallel_dim_name):
        if name not in device_mesh.axis_names:
            fail("device_mesh", device_mesh, f"a mesh with an axis named {name!r} (its axes: {device_mesh.axis_names})")
    devices = device_mesh.shape[device_mesh.axis_names.index(model_parallel_dim_name)]
    rules = [(path, axes, lambda c: ("vocabulary_size", c["vocabulary_size"])) for path, axes in _VOCABULARY]
    for index, block in enumerate(config["blocks"]):
        rules += [(rf"block_{index}/{path}", axes, size) for path, axes, size in _MIXERS[block]]
        if block == "3lin" or config["ffn"] in ("none", "wide"):
            continue
        if config["ffn"] == "feedforward2":
            parts, size = _FEEDFORWARD2, _intermediate(lambda c: c["hidden_dim"])
        else:
            parts, size = _FEED_FORWARD, _intermediate(lambda c: 4 * c["hidden_dim"])
        rules += [(rf"block_{index}/ffn/{path}", axes, size) for path, axes in parts]
    if config["ffn"] == "wide":
        wide = _intermediate(lambda c: 4 * c["hidden_dim"] * c["num_layers"])
        rules += [(f"wide_ffn/{path}", axes, wide) for path, axes in _FEED_FORWARD]

    layouts = keras.distribution.LayoutMap(device_mesh)
    for path, axes, size in rules:
        name, count = size(config)
        if count % devices:
            raise ValueError(
                f"The model axis {model_parallel_dim_name!r} of {devices} devices must divide {name}, which it cuts "
                f"(`ElitaBackbone.get_layout_map`). Received: {name}={count}"
            )
        layouts[path] = tuple(model_parallel_dim_name if axis == _MODEL else axis for axis in axes)
    return layouts
