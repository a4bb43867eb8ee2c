"""LoRA on a backbone's projections: the rank checked, the adapters saved exactly, merged for serving.

Keras saves an adapted `Dense`/`EinsumDense` with its kernel merged (`W + A B`) and, on loading,
zeroes both adapters. The function survives, but with `A = B = 0` neither adapter has a gradient
again: a resumed run, or a saved adapted model trained further, would never move. `keep_exact`
makes an adapted layer also save its frozen kernel and both adapters, and restore them after
Keras' own load, so an adapted model resumes and trains exactly as it was saved. Keras' own
entries stay as they are, so a reader that knows nothing of the adapters still gets the merged
function.
"""

import math

from elita_tf.checks import check_integer

_EXACT = "lora_exact_"  # the store keys of an adapted layer's own variables, in order


def adapted_layers(backbone, target_layer_names):
    """The layers `keras_hub.models.Backbone.enable_lora` adapts: those named in `target_layer_names`."""
    return [
        layer
        for layer in backbone._flatten_layers(include_self=False)
        if layer.weights and layer.name in target_layer_names and hasattr(layer, "enable_lora")
    ]


def check_rank(layers, rank):
    """Raises `ValueError` unless `rank` is a positive integer that some adapted projection can use.

    A `m x n` kernel gets adapters `A [m, r]` and `B [r, n]`, whose product has rank at most
    `min(m, n)`. A rank past that side of every projection adds weights and nothing else.
    """
    check_integer("rank", rank)

    def sides(layer):
        shape = layer.kernel.shape
        return math.prod(shape[:-1]), shape[-1]

    widest = max(layers, key=lambda layer: min(sides(layer)))
    rows, columns = sides(widest)
    if rank > min(rows, columns):
        adapters = sum(rank * sum(sides(layer)) for layer in layers)
        raise ValueError(
            f"A LoRA rank past every adapted projection's narrower side adds weights and nothing else: the widest, "
            f"{widest.path}, is {rows} x {columns}, so the rank can be at most {min(rows, columns)} (this one would "
            f"train {adapters:,} adapter weights). Received: rank={rank}"
        )


def keep_exact(layer):
    """Makes an adapted layer save and load its frozen kernel and adapters exactly (see the module doc)."""
    keras_save, keras_load = layer.save_own_variables, layer.load_own_variables

    def save_own_variables(store):
        keras_save(store)  # Keras' entries: the merged kernel, for readers without adapters
        for i, variable in enumerate(layer.variables):
            store[f"{_EXACT}{i}"] = variable

    def load_own_variables(store):
        keras_load(store)  # the merged kernel, and zeroed adapters
        if f"{_EXACT}0" in store:
            for i, variable in enumerate(layer.variables):
                variable.assign(store[f"{_EXACT}{i}"])

    # Instance attributes: Keras' saving calls `layer.save_own_variables(store)`.
    layer.save_own_variables = save_own_variables
    layer.load_own_variables = load_own_variables


def merged_kernels(backbone):
    """`{id(frozen kernel): merged kernel W + A B}` of every adapted layer of `backbone`."""
    # An adapted layer's `kernel` is the merged one; its weights list the frozen `_kernel`.
    return {
        id(layer._kernel): layer.kernel
        for layer in backbone._flatten_layers(include_self=False)
        if getattr(layer, "lora_enabled", False)
    }


def is_adapter(weight):
    return weight.path.rsplit("/", 1)[-1] in ("lora_kernel_a", "lora_kernel_b")


class LoraAdapters:
    """keras-hub's `enable_lora` for `ElitaBackbone`: every projection adapted, the rank checked, the
    adapters saved exactly and merged for serving. Mixed into the backbone before keras-hub's `Backbone`."""

    def enable_lora(self, rank, target_layer_names=None):
        """keras-hub's `enable_lora`, remembered in the config (with the default targets), so an adapted
        model saves, loads and resumes training as one: its adapters are saved exactly (`keep_exact`).

        Raises:
            ValueError: for other targets, or a rank past the narrower side of an adapted projection.
        """
        if target_layer_names is not None:
            raise ValueError(
                "ElitaBackbone adapts its default projections (`default_lora_layer_names`), so that a saved adapted "
                f"model loads as one. Received: target_layer_names={target_layer_names!r}"
            )
        layers = adapted_layers(self, self.default_lora_layer_names())
        check_rank(layers, rank)
        super().enable_lora(rank)
        for layer in layers:
            keep_exact(layer)
        self.lora_rank = rank

    def check_lora_rank(self, rank):
        """Raises `ValueError` for a rank `enable_lora` refuses: not a positive integer, or past the
        narrower side of every projection it adapts (adapter weights that add nothing)."""
        check_rank(adapted_layers(self, self.default_lora_layer_names()), rank)

    def merge_lora(self):
        """A backbone without adapters whose projections hold `W + A B`: the same function, for serving.

        Example:
        >>> backbone.enable_lora(4)          # doctest: +SKIP
        >>> merged = backbone.merge_lora()   # doctest: +SKIP
        """
        if self.lora_rank is None:
            raise ValueError("This backbone has no LoRA adapters to merge: call `enable_lora(rank)` first.")
        config = self.get_config()
        del config["lora_rank"]
        merged = type(self).from_config(config)
        kernels = merged_kernels(self)
        sources = [w for w in self.weights if not is_adapter(w)]
        for target, source in zip(merged.weights, sources, strict=True):
            target.assign(kernels.get(id(source), source))
        return merged

    def default_lora_layer_names(self):
        """Every projection of every block (not the embedding or the head): `enable_lora(rank)` adapts them all."""
        return [
            *("k1", "k2", "k3", "query", "key", "value", "output", "attention_output"),  # token mixers
            *("query_key", "query_value", "combiner"),  # 3Lin
            *("w1", "w2", "w3", "inner", "outer"),  # feed-forward networks
        ]
