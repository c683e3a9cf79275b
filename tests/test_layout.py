"""The code's shape, as the README's Layout section promises it: rooms import downward, every unit is small.

Read from the source with ``ast``, nothing imported: every import between
tfcluster's modules (at the top or inside a function) goes to a lower room of
:data:`ROOMS`, so there is no import circle; no module is longer than 500
lines, no class than 250, no function than 80; every public name has a
docstring; TF's false-duplicate marker text lives in one module.
"""

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tfcluster")

#: tfcluster's modules, lowest room first; a module may import only from rooms before its own.
ROOMS = [
    ["core.version", "core.exits"],
    ["core.errors"],
    ["core.tferrors", "core.logs"],
    ["core.duplicates"],
    ["core.posix", "core.tfguard", "core.private"],
    ["core"],
    ["topology.ports", "topology.slurm", "topology.tfconfig"],
    ["topology.cluster", "topology.taskenv", "topology.devices"],
    ["topology"],
    ["runtime.server", "runtime.checkpoints", "runtime.preemption"],
    ["runtime"],
    ["data.pipeline", "data.loaders"],
    ["data"],
    ["graph.model", "graph.placement", "graph.wire"],
    ["graph"],
    ["training.hooks"],
    ["training.liveness"],
    ["strategies.towers"],
    ["strategies.base"],
    ["strategies.local", "strategies.mirrored", "strategies.sync"],
    ["strategies.parameter_server", "strategies.collective", "strategies.sync_replicas"],
    ["strategies"],
    ["training.chief"],
    ["training.session"],
    ["training.loop"],
    ["training.evaluation", "training.train_metrics"],
    ["training.train"],
    ["training"],
    ["estimator.spec", "estimator.run_config", "estimator.inputs"],
    ["estimator.calls"],
    ["estimator.training_graph", "estimator.inference", "estimator.export"],
    ["estimator.estimator"],
    ["estimator.keras", "estimator.training"],
    ["estimator"],
    ["keras"],
    ["launch.config", "launch.output", "launch.processes"],
    ["launch.isolation", "launch.plan"],
    ["launch.supervisor"],
    ["launch"],
    ["tf1.contrib", "tf1.mnist", "tf1.mnist_model", "tf1.robust"],
    ["tf1.overrides"],
    ["tf1"],
    ["tf1.__main__"],
    ["cli.common"],
    ["cli.start", "cli.local", "cli.spec", "cli.status"],
    ["cli"],
    ["__init__", "__main__"],
]
RANK = {name: i for i, room in enumerate(ROOMS) for name in room}

MAX_MODULE_LINES, MAX_CLASS_LINES, MAX_FUNCTION_LINES = 500, 250, 80


def _modules() -> dict:
    """``{dotted name inside tfcluster: (path, source)}``; a package is named by its own name."""
    out = {}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, PACKAGE)[:-3].replace(os.sep, ".")
            name = rel[: -len(".__init__")] if rel.endswith(".__init__") else rel
            with open(path, encoding="utf-8") as fh:
                out[name] = (path, fh.read())
    return out


MODULES = _modules()


def _is_package(name) -> bool:
    return MODULES[name][0].endswith("__init__.py")


def _resolve(module: str, node) -> list:
    """The tfcluster modules an import statement of ``module`` names (any depth, any place)."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
        return [t[len("tfcluster."):] for t in targets if t.startswith("tfcluster.")]
    if node.level == 0:
        if not (node.module or "").startswith("tfcluster"):
            return []
        base = node.module[len("tfcluster"):].lstrip(".")
    else:
        parts = module.split(".") if module not in ("__init__", "__main__") else []
        # A package's own __init__ sits one level deeper than its name says.
        package = parts if _is_package(module) and module != "__init__" else parts[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}" if base else alias.name
        if sub in MODULES:
            out.append(sub)               # ``from . import local``: the submodule itself
        elif base in MODULES or base == "":
            out.append(base or "__init__")
    return out


def imports() -> list:
    """``[(importer, imported)]`` between tfcluster's modules, without the facade's lazy names."""
    edges = []
    for name, (_, source) in MODULES.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges += [(name, target) for target in _resolve(name, node) if target != name]
    return edges


def test_every_module_has_a_room():
    assert sorted(set(MODULES) - set(RANK)) == []


def test_every_import_goes_to_a_lower_room_so_there_is_no_import_circle():
    upward = [f"{a} imports {b}" for a, b in imports() if RANK[b] >= RANK[a]]
    assert upward == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_classes_and_functions_stay_small(name):
    path, source = MODULES[name]
    assert source.count("\n") <= MAX_MODULE_LINES, f"{path}: {source.count(chr(10))} lines"
    for node in ast.walk(ast.parse(source)):
        size = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
        if isinstance(node, ast.ClassDef):
            assert size <= MAX_CLASS_LINES, f"{path}: class {node.name} has {size} lines"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert size <= MAX_FUNCTION_LINES, f"{path}: {node.name}() has {size} lines"


def _public(tree):
    """Public classes and functions of a module, and the public methods of its public classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            yield node.name, node
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                        yield f"{node.name}.{item.name}", item


def test_every_module_and_public_name_has_a_docstring():
    missing = []
    for name, (path, source) in MODULES.items():
        tree = ast.parse(source)
        if ast.get_docstring(tree) is None:
            missing.append(name)
        missing += [f"{name}.{what}" for what, node in _public(tree) if ast.get_docstring(node) is None]
    assert missing == []


def test_the_false_duplicate_marker_lives_in_one_module():
    holders = [name for name, (_, source) in MODULES.items() if "received twice" in source]
    assert holders == ["core.duplicates"]
