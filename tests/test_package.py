"""The package's shape: one model, no import cycles between its modules."""

import ast
import os
import subprocess
import sys

# Found without importing it: a cycle that breaks the import must still be reported as a cycle.
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "elita_tf")


def _module_imports(deferred=False):
    """`{module: {elita_tf modules it imports}}` for every module of the package: at module level, and with
    `deferred` inside its functions too."""
    graph = {}
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            parts = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].split(os.sep)
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            imports = set()
            tree = ast.parse(open(path).read())
            for node in ast.walk(tree) if deferred else tree.body:
                if isinstance(node, ast.ImportFrom) and node.module == "elita_tf":  # `from elita_tf import backend`
                    imports.update(f"elita_tf.{alias.name}" for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("elita_tf"):
                    imports.add(node.module)
                elif isinstance(node, ast.Import):
                    imports.update(alias.name for alias in node.names if alias.name.startswith("elita_tf"))
            graph[module] = imports
    return graph


def test_no_module_imports_itself_through_others():
    # Imports inside functions count: one that would close a circle only hides it until that function runs.
    graph = _module_imports(deferred=True)
    edges = {m: imports - {m} for m, imports in graph.items()}
    state = {}

    def visit(module, path):
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", "import cycle: " + " -> ".join(path + [module])
        state[module] = "open"
        for imported in sorted(edges.get(module, ())):
            visit(imported, path + [module])
        state[module] = "done"

    for module in sorted(edges):
        visit(module, [])
    assert len(graph) > 40  # every module was read


def test_one_model_class():
    import elita_tf.models

    assert not {"DecoderModel", "DecoderConfig", "build_decoder", "Generator", "preset", "PRESETS"} & set(
        dir(elita_tf.models)
    )
    sources = [os.path.join(d, f) for d, _, files in os.walk(PACKAGE) for f in files if f.endswith(".py")]
    for path in sources:
        text = open(path).read()
        assert "build_decoder" not in text and "DecoderModel" not in text and "elita_tf.generation" not in text, path


def test_import_and_the_commands_help_load_no_tensorflow():
    # Every command's `--help` (and a bad flag) answers before TensorFlow is imported: the package loads lazily.
    code = (
        "import sys, contextlib, io\n"
        "import elita_tf\n"
        "from elita_tf.cli import compare, evaluate, export, recall, train\n"
        "for main in (train.main, compare.main, evaluate.main, export.main, recall.main):\n"
        "    for argv in (['--help'], ['--no-such-flag']):\n"
        "        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "            try:\n"
        "                main(argv)\n"
        "            except SystemExit:\n"
        "                pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras', 'keras_hub', 'numpy'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_a_class_imported_from_its_package_is_registered_with_keras():
    code = (
        "import keras\n"
        "from elita_tf.models import ElitaCausalLM\n"
        "names = ['ElitaBackbone', 'ElitaCausalLM', 'ElitaTokenizer', 'Attention2']\n"
        "print([keras.saving.get_registered_object('elita_tf>' + name) is not None for name in names])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[True, True, True, True]", out


# Which packages each package may import at module level: data flows one way (docs/contributing.md).
LAYERS = {
    "backend": {"backend", "private_apis"},
    "ops": {"backend", "ops", "private_apis", "lazy", "checks", "renames"},
    "layers": {"backend", "ops", "layers", "private_apis", "lazy", "checks", "renames"},
    "models": {"backend", "ops", "layers", "models", "private_apis", "lazy", "checks", "renames"},
    "data": {"data", "lazy", "checks", "settings_fields", "renames"},
    "export": {"backend", "ops", "layers", "models", "data", "export", "lazy", "checks", "renames"},
    "training": {
        *("backend", "ops", "layers", "models", "data", "export", "training", "schedules", "optimizers", "lazy"),
        *("checks", "settings_fields", "renames"),
    },
    "cli": {"cli", "data", "layers", "models", "training", "export", "checks", "settings_fields", "renames"},
    # The argument checks, the settings' fields and the table of renamed names: no TensorFlow, under every
    # package that checks or takes an old name.
    "checks": set(),
    "settings_fields": {"checks"},
    "renames": set(),
    "lazy": {"renames"},
}


def test_each_package_imports_only_the_ones_below_it():
    for module, imports in _module_imports().items():
        package = module.split(".")[1] if module.count(".") else ""
        if package not in LAYERS:
            continue
        for imported in imports:
            parts = imported.split(".")
            target = parts[1] if len(parts) > 1 else ""
            assert target in LAYERS[package], f"{module} imports {imported}"


def _module_level_assignments():
    """`{(module, name): value node}` of every module-level assignment of the package."""
    found = {}
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                module = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                for node in ast.parse(open(path).read()).body:
                    targets = node.targets if isinstance(node, ast.Assign) else []
                    for target in targets:
                        if isinstance(target, ast.Name):
                            found[(module, target.id)] = node.value
    return found


def test_every_enumeration_and_default_is_defined_once():
    # A constant (an upper-case module-level name) is defined by one module and imported by the others,
    # and no two modules spell out the same enumeration (a tuple of strings) under different names.
    owners, spelled = {}, {}
    for (module, name), value in _module_level_assignments().items():
        if name.isupper() or (name.startswith("_") and name[1:].isupper()):
            owners.setdefault(name.lstrip("_"), []).append(module)
        if isinstance(value, ast.Tuple) and len(value.elts) > 1:
            if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts):
                spelled.setdefault(tuple(sorted(e.value for e in value.elts)), []).append(f"{module}.{name}")
    assert {name: modules for name, modules in owners.items() if len(modules) > 1} == {}
    assert {names: where for names, where in spelled.items() if len(where) > 1} == {}


def test_private_keras_and_tensorflow_apis_are_imported_in_one_module():
    private = ("keras.src", "keras_hub.src", "tensorflow.python")
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py") or name == "private_apis.py":
                continue
            for node in ast.walk(ast.parse(open(os.path.join(directory, name)).read())):
                modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                modules += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                assert not [m for m in modules if m.startswith(private)], (name, modules)
