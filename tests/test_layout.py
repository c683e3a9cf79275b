"""The code's shape, as the README's Layout section promises it: folders show the pipeline, rooms import
downward, every unit is small.

Read from the source with ``ast``, nothing imported: the package's modules
live in the folders of :data:`LAYERS` (nothing but ``__init__`` and
``__main__`` at the top); every import between tfcluster's modules (at the
top or inside a function) goes to a lower layer, or to a lower room of its own
folder, so there is no import circle, and folders side by side in one layer
(the front ends) do not import each other; no module is longer than 500 lines,
no class than 250, no function than 80; every public name has a docstring, and
each folder's ``__init__`` docstring names each of its modules; no module reads
another's private names; TF's false-duplicate marker text lives in one module.
The README's Layout drawing and table name the same folders, in the same order,
so they cannot drift from the code.
"""

import ast
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "tfcluster")

#: tfcluster's layers, lowest first. Each layer holds one or more folders (side by side: they may not import
#: each other); each folder is a list of rooms, lowest first. A module may import from any lower layer, and
#: from the rooms of its own folder before its own.
LAYERS = [
    [("core", [["core.version", "core.exits", "core.environment", "core.patches"], ["core.errors"], ["core.checks"], ["core.tferrors", "core.logs", "core.programs"],
               ["core.duplicates"], ["core.posix", "core.tfguard", "core.private"], ["core"]])],
    [("topology", [["topology.ports", "topology.slurm", "topology.tfconfig"],
                   ["topology.cluster"], ["topology.taskenv", "topology.devices"], ["topology"]])],
    [("runtime", [["runtime.server", "runtime.checkpoints", "runtime.preemption"], ["runtime.shutdown"],
                  ["runtime"]])],
    [("data", [["data.pipeline", "data.loaders"], ["data"]])],
    [("graph", [["graph.gate"], ["graph.model", "graph.placement", "graph.crossing", "graph.precision", "graph.inplace_reads",
                "graph.lazy_adam", "graph.step", "graph.sparse_updates"], ["graph.wire", "graph.repartition", "graph.prefetch"], ["graph.sparse", "graph.traffic"],
                ["graph"]])],
    [("embedding", [["embedding.options"], ["embedding.variable"], ["embedding.saving", "embedding.updates"],
                    ["embedding.increments"], ["embedding.create"], ["embedding.columns"], ["embedding"]])],
    [("strategies", [["strategies.towers", "strategies.keras_towers"], ["strategies.base"],
                     ["strategies.local", "strategies.mirrored", "strategies.sync", "strategies.recorded"], ["strategies.sync_run"],
                     ["strategies.parameter_server", "strategies.collective", "strategies.sync_replicas"],
                     ["strategies"]])],
    [("training", [["training.timer", "training.checkpoint_watch", "training.savers"],
                   ["training.hooks", "training.liveness", "training.input_position"], ["training.chief"],
                   ["training.session"],
                   ["training.loop", "training.assembly"], ["training.evaluation", "training.train_metrics"], ["training.train"],
                   ["training"]])],
    [("estimator", [["estimator.spec", "estimator.run_config", "estimator.inputs", "estimator.warm_start"],
                    ["estimator.calls"], ["estimator.replicas", "estimator.inference"],
                    ["estimator.training_graph", "estimator.export"],
                    ["estimator.estimator"], ["estimator.keras", "estimator.training", "estimator.canned"],
                    ["estimator"]]),
     ("horovod", [["horovod.tensorflow"], ["horovod.optimizers", "horovod.callbacks", "horovod.objects"], ["horovod.keras"],
                  ["horovod"]]),
     ("keras", [["keras.step", "keras.checkpoints", "keras.towers", "keras.collective"], ["keras.session", "keras.graph"], ["keras.fit"], ["keras"]])],
    [("launch", [["launch.memory", "launch.forked", "launch.exec_bound"], ["launch.config", "launch.output", "launch.processes", "launch.result", "launch.task"],
                 ["launch.isolation", "launch.plan", "launch.restarts"], ["launch.supervisor"], ["launch"]])],
    [("tf1", [["tf1.distribute", "tf1.slim", "tf1.estimator_paths"], ["tf1.contrib", "tf1.mnist", "tf1.mnist_model", "tf1.robust"], ["tf1.overrides"], ["tf1.deeprec"],
              ["tf1"],
              ["tf1.__main__"], ["tf1.forkserver"]]),
     ("tf2", [["tf2.strategies", "tf2.names", "tf2.servers", "tf2.faults", "tf2.preemption", "tf2.progress"], ["tf2.checkpoints", "tf2.keras3", "tf2.collectives"], ["tf2"], ["tf2.__main__"]])],
    [("cli", [["cli.common"], ["cli.start", "cli.local", "cli.spec", "cli.status"], ["cli.horovodrun"], ["cli"]])],
    [("", [["__init__", "__main__"]])],
]
#: module -> (layer, folder, room in its folder)
PLACE = {name: (layer, folder, room)
         for layer, folders in enumerate(LAYERS) for folder, rooms in folders
         for room, names in enumerate(rooms) for name in names}
FOLDERS = [folder for folders in LAYERS for folder, _ in folders if folder]

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


def test_every_module_has_a_room_in_its_own_folder_and_only_the_entry_points_sit_at_the_top():
    assert sorted(set(MODULES) - set(PLACE)) == []
    assert sorted(set(PLACE) - set(MODULES)) == []
    misplaced = [name for name, (_, folder, _) in PLACE.items()
                 if name.split(".")[0] != folder and folder]
    assert misplaced == []


def _allowed(importer: str, imported: str) -> bool:
    (la, fa, ra), (lb, fb, rb) = PLACE[importer], PLACE[imported]
    return lb < la or (fa == fb and rb < ra)


def test_every_import_goes_to_a_lower_layer_or_room_so_there_is_no_import_circle():
    upward = [f"{a} imports {b}" for a, b in imports() if not _allowed(a, b)]
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


def test_each_folders_init_docstring_names_every_module_it_holds():
    unnamed = []
    for folder in FOLDERS:
        doc = ast.get_docstring(ast.parse(MODULES[folder][1])) or ""
        for name in MODULES:
            if name.startswith(folder + ".") and not re.search(rf"\b{re.escape(name.split('.')[-1])}\b", doc):
                unnamed.append(name)
    assert unnamed == []


def _private_names() -> set:
    """Private functions, methods, classes and module variables defined in tfcluster."""
    names = set()
    for _, source in MODULES.values():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name.startswith("_") \
                    and not node.name.startswith("__"):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name) and t.id.startswith("_")
                             and not t.id.startswith("__"))
    return names


#: Private names of Python's own API that tfcluster's objects carry too (namedtuple's).
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}


def _foreign_names(tree) -> set:
    """Names a module binds to other packages' modules and classes (TF's private API, patched on purpose)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith("tfcluster"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not (node.module or "").startswith("tfcluster"):
            names.update(a.asname or a.name for a in node.names)
    return names


def test_no_module_reads_another_modules_private_names():
    private = _private_names() - NAMEDTUPLE_API
    reads = []
    for name, (_, source) in MODULES.items():
        tree = ast.parse(source)
        foreign = _foreign_names(tree) | {"self", "cls"}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _resolve(name, node):
                reads += [f"{name} imports {a.name}" for a in node.names if a.name.startswith("_")
                          and not a.name.startswith("__")]
            elif isinstance(node, ast.Attribute) and node.attr in private:
                root = node.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if not (isinstance(root, ast.Name) and root.id in foreign):
                    reads.append(f"{name} line {node.lineno} reads {ast.unparse(node)}")
    assert reads == []


def _readme_layout() -> str:
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    return text[text.index("\n## Layout\n"):].split("\n## ", 2)[1]


def test_the_readme_drawing_shows_every_folder_in_the_order_of_the_layers():
    block = _readme_layout().split("```")[1]
    drawn = [re.findall(r"(\w+)/", line.split("  ")[0]) for line in block.splitlines()
             if re.match(r"^\s*\w+/", line)]
    assert drawn == [[folder for folder, _ in layer] for layer in reversed(LAYERS) if layer[0][0]]


def test_the_readme_drawing_names_each_module_of_a_folder_on_its_line():
    lines = {tuple(re.findall(r"(\w+)/", line.split("  ")[0])): line
             for line in _readme_layout().split("```")[1].splitlines() if re.match(r"^\s*\w+/", line)}
    missing = []
    for folders, line in lines.items():
        if len(folders) > 1:
            continue        # the front ends share a line that says what they are
        for name in MODULES:
            short = name.split(".")[-1]
            if name.startswith(folders[0] + ".") and not re.search(rf"\b{short}\b", line.split("  ", 1)[1]):
                missing.append(name)
    assert missing == []


def test_the_readme_table_gives_every_folder_one_row():
    rows = re.findall(r"^\| `tfcluster/(\w+)/` \|", _readme_layout(), re.M)
    assert sorted(rows) == sorted(FOLDERS)
    assert len(rows) == len(set(rows))


def test_the_docs_map_draws_every_folder_in_layer_order_and_every_path_it_names_exists():
    text = open(os.path.join(REPO, "docs", "map.md"), encoding="utf-8").read()
    drawn = [f for line in text.split("```")[1].splitlines() for f in re.findall(r"(?:^|\s)(\w+)/ ", line)]
    assert drawn == [folder for layer in reversed(LAYERS) for folder, _ in layer if folder]
    named = set(re.findall(r"`(tfcluster/[\w/]+(?:\.py)?)`", text))
    assert named and sorted(p for p in named if not os.path.exists(os.path.join(REPO, p))) == []


#: The shape of a module-level bound on a wait, and the names of that shape that bound none of tfcluster's waits.
WAIT_NAME = re.compile(r"^[A-Z][A-Z0-9_]*_(SECS|TIMEOUT|GRACE|LIMIT)$")
NOT_WAITS = {"EXIT_TIMEOUT": "an exit code", "TF_DEFAULT_STOP_GRACE": "TensorFlow's own, which TF1 mode replaces",
             "DEFAULT_SAVE_SECS": "the Estimator's save period", "PROGRESS_INTERVAL_SECS": "a report interval"}


def _numeric_constants() -> dict:
    """``{(path, NAME): value}`` for every module-level ``NAME = <number>`` (tuples too) in tfcluster."""
    out = {}
    for path, source in MODULES.values():
        rel = os.path.relpath(path, REPO)
        for node in ast.parse(source).body:
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            target, value = node.targets[0], node.value
            pairs = (zip(target.elts, value.elts) if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                     else [(target, value)])
            for t, v in pairs:
                if isinstance(t, ast.Name) and isinstance(v, ast.Constant) and type(v.value) in (int, float):
                    out[(rel, t.id)] = float(v.value)
    return out


def test_the_docs_map_lists_every_wait_once_with_the_value_its_module_gives_it():
    text = open(os.path.join(REPO, "docs", "map.md"), encoding="utf-8").read()
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \| ([\d.]+) \| `(tfcluster/[\w/]+\.py)` \|", text, re.M)
    listed = {(path, name): float(value) for name, value, path in rows}
    assert len(listed) == len(rows)
    waits = {key: value for key, value in _numeric_constants().items()
             if WAIT_NAME.match(key[1]) and key[1] not in NOT_WAITS}
    assert listed == waits


def _code_strings(tree):
    """Every string constant of a module's code, its docstrings left out."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            docs.add(id(node.body[0].value))
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def test_every_tfcluster_environment_variable_is_named_in_one_table():
    spelled = [name for name, (_, source) in MODULES.items() if name != "core.environment"
               and any("TFCLUSTER_" in text for text in _code_strings(ast.parse(source)))]
    assert spelled == []


def test_the_false_duplicate_marker_lives_in_one_module():
    holders = [name for name, (_, source) in MODULES.items() if "received twice" in source]
    assert holders == ["core.duplicates"]


def test_every_user_facing_error_class_is_declared_in_core_errors():
    # One home for the errors a user reads (their exit codes and their names); modules raise them from there.
    known = {"TfclusterError", "SpecError"}
    errors = ast.parse(MODULES["core.errors"][1])
    known |= {node.name for node in ast.walk(errors) if isinstance(node, ast.ClassDef)}
    elsewhere = [f"{name}.{node.name}" for name, (_, source) in MODULES.items() if name != "core.errors"
                 for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)
                 and any(isinstance(base, ast.Name) and base.id in known for base in node.bases)]
    assert elsewhere == []
