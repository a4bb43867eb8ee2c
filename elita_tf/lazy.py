"""Packages whose public names load their modules on first use (PEP 562).

`import elita_tf` and a command's `--help` then do not wait for TensorFlow: it is imported with
the first layer, model or op that is used. A Keras class is registered (for `.keras` files and
presets) when its module loads, that is when the class is first imported or used.
"""

import importlib

from elita_tf.renames import renamed_attribute


def lazy_exports(package, exports):
    """`(__getattr__, __dir__, __all__)` for `package`: `exports` maps each public name to the module holding it.

    A name that maps to itself is a submodule (`"layers": "layers"`). A name the package exported
    once under another name is today's, with a warning (`elita_tf.renames`).
    """

    def __getattr__(name):
        if name not in exports:
            return renamed_attribute(package, name)
        module = importlib.import_module(f"{package}.{exports[name]}")
        return module if exports[name] == name else getattr(module, name)

    def __dir__():
        return sorted(exports)

    return __getattr__, __dir__, sorted(exports)
