"""A backbone's dtype policies through keras-hub's presets: mixed precision and quantized layers load as saved.

keras-hub's loaders read a saved `dtype` as a plain dtype (`"mixed_bfloat16"` raises in
`CausalLM.from_preset`), its generic `Backbone.from_preset` replaces it with None, and Keras
saves a quantized model's `DTypePolicyMap` without its default policy. So the config also keeps
the quantized layers and the mixed-precision policy apart from `dtype`, and a `dtype` given at
loading (`from_preset(..., dtype="float32")`) wins over the saved one.
"""

import re
import warnings

import keras

_PolicyMap = keras.dtype_policies.DTypePolicyMap


class SavedPolicies:
    """A `keras_hub.models.Backbone` mixin: its config saves and loads its dtype policies; a quiet `quantize`."""

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Keras' `quantize`, without its warning for each layer that has nothing to quantize.

        Keras warns for every layer without a `quantize` method: the input, dropout and the norms,
        which hold no matrix. A layer that holds one (a learned position table) is still named.
        """
        with warnings.catch_warnings():
            for layer in self._flatten_layers(include_self=False):
                if not any(len(weight.shape) >= 2 for weight in layer.weights):
                    warnings.filterwarnings(
                        "ignore", f"Layer {re.escape(type(layer).__name__)} does not have a `quantize` method"
                    )
            super().quantize(mode, config=config, filters=filters, **kwargs)

    def get_config(self):
        config = super().get_config()
        quantized = {
            layer.path: layer.quantization_mode
            for layer in self._flatten_layers(include_self=False)
            if layer.quantization_mode is not None
        }
        if quantized:
            config["quantized_layers"] = quantized
        policy = self.dtype_policy
        policy = policy.default_policy if isinstance(policy, _PolicyMap) else policy
        if policy.compute_dtype != policy.variable_dtype:
            config["mixed_precision_policy"] = policy.name
            if not quantized:
                config["dtype"] = None
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        quantized = config.pop("quantized_layers", None)
        mixed = config.pop("mixed_precision_policy", None)
        dtype = config.get("dtype")
        if mixed is not None and (dtype is None or quantized and isinstance(dtype, dict)):
            dtype = config["dtype"] = mixed  # the saved policy, unless a `dtype` was given
        if quantized and not isinstance(dtype, (dict, _PolicyMap)):
            policy = keras.dtype_policies.get(dtype) if dtype is not None else keras.config.dtype_policy()
            policies = _PolicyMap(default_policy=policy)
            for path, mode in quantized.items():
                policies[path] = keras.dtype_policies.get(f"{mode}_from_{policy.name}")
            config["dtype"] = policies
        return super().from_config(config)
