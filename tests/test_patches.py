"""tfcluster changes third-party callables in one place, each once, and can take every change back.

Every patch (tfcluster/core/patches.py) names a target that exists on the
pinned TensorFlow, tf-keras and tensorflow-estimator, with the parameters its
wrapper relies on; docs/patches.md lists them all; no module outside the
registry assigns to TensorFlow's names; ``Session.run`` is wrapped once, with
its layers in a fixed order whatever order they were added in.
"""

import ast
import importlib
import inspect
import os
import pkgutil
import re

import pytest

import tfcluster
from tfcluster.core import patches

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "patches.md")
#: Modules that give TF's internal modules names they lack (module tables, not wrappers of a callable).
NAME_TABLES = {"tfcluster.estimator.canned", "tfcluster.tf1.slim"}
THIRD_PARTY = ("tensorflow", "tf_keras", "tensorflow_estimator", "keras")


def every_module():
    """Every tfcluster module but the ``__main__``\\ s, imported (so every patch is registered)."""
    names = [m.name for m in pkgutil.walk_packages(tfcluster.__path__, "tfcluster.")
             if not m.name.endswith("__main__")]
    return [importlib.import_module(n) for n in names]


@pytest.fixture(scope="module")
def registry():
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    every_module()
    return patches.registered()


def test_every_target_exists_on_the_pinned_versions_with_the_parameters_its_patch_relies_on(registry):
    assert len(registry) >= 20
    for patch in registry:
        current = patches.original(patch.name)
        if patch.adds:      # a name TF removed: its owner is there, the name is not (else TF's own would stay)
            patches.resolve(patch.target)       # the owner is there (it raises otherwise)
            assert current is None or patches.installed(patch.name), \
                f"{patch.name}: this TensorFlow has {patch.target} again: drop the patch"
            continue
        assert callable(current), f"{patch.name}: {patch.target} is not a callable on this TensorFlow"
        if patch.params:
            names = list(inspect.signature(current).parameters)
            assert names[:len(patch.params)] == list(patch.params), \
                f"{patch.name}: {patch.target} takes {names}, the patch expects {list(patch.params)} first"


def test_a_name_tf_removed_is_added_while_installed_and_gone_again_after(registry):
    from tensorflow.python.distribute import distribute_lib
    name = "tf2.experimental_run_v2"
    with patches.taken_out(name):
        assert not hasattr(distribute_lib.StrategyBase, "experimental_run_v2")
        assert patches.install(name) is True
        assert callable(distribute_lib.StrategyBase.experimental_run_v2)
        patches.uninstall(name)
        assert not hasattr(distribute_lib.StrategyBase, "experimental_run_v2")


def test_docs_list_every_patch_and_session_layer(registry):
    text = open(DOC).read()
    block = re.search(r"<!-- patches -->\n(.*?)<!-- /patches -->", text, re.S)
    assert block, "docs/patches.md lacks its <!-- patches --> block"
    assert block.group(1) == patches.table(), "docs/patches.md is stale: paste patches.table() between the marks"


def test_an_install_happens_once_and_an_uninstall_gives_tensorflow_its_own_callable_back(registry):
    from tensorflow.python.training import supervisor
    name = "tf1.quiet_second_supervisor_stop"
    with patches.taken_out(name):
        tf_own = supervisor.Supervisor.stop
        assert patches.install(name) is True
        assert patches.install(name) is False                  # once: never stacked
        assert supervisor.Supervisor.stop is not tf_own
        assert supervisor.Supervisor.stop.__wrapped__ is tf_own
        assert patches.original(name) is tf_own
        patches.uninstall(name)
        assert supervisor.Supervisor.stop is tf_own
        assert "stop" in vars(supervisor.Supervisor)


def test_a_patch_of_an_inherited_method_leaves_the_class_as_it_was(registry):
    from tensorflow.python.client import session as session_lib
    with patches.taken_out("tf1.cluster_sessions"):
        own = "__init__" in vars(session_lib.Session)
        patches.install("tf1.cluster_sessions")
        patches.uninstall("tf1.cluster_sessions")
        assert ("__init__" in vars(session_lib.Session)) == own


def test_a_context_patch_is_there_only_inside_its_with(registry):
    from tensorflow.python.data.ops import from_tensor_slices_op
    from tfcluster.data.pipeline import arrays_outside_the_graph
    with patches.taken_out("data.slices_outside"):
        tf_own = from_tensor_slices_op._from_tensor_slices
        with arrays_outside_the_graph():
            assert from_tensor_slices_op._from_tensor_slices is not tf_own
        assert from_tensor_slices_op._from_tensor_slices is tf_own


def test_session_run_is_wrapped_once_with_its_layers_innermost_first_whatever_order_they_came_in(registry):
    import tensorflow as tf
    from tensorflow.python.client import session as session_lib
    seen = []

    def noting(label):
        def wrap(session, fn):
            def call(*args, **kwargs):
                seen.append(label)
                return fn(*args, **kwargs)
            return call
        return wrap
    for name, order in (("test.outer", 1001), ("test.inner", 1000)):
        patches.register_session_layer(patches.SessionLayer(name, order, "test", noting(name), "test"))
    try:
        for name in ("test.outer", "test.inner"):          # the outer one first
            assert patches.add_session_layer(name)
        assert not patches.add_session_layer("test.inner")
        run = session_lib.BaseSession.run
        assert getattr(run.__wrapped__, "__wrapped__", None) is None    # one wrapper over TF's run
        graph = tf.Graph()
        with graph.as_default():
            two = tf.constant(2)
        with tf.compat.v1.Session(graph=graph) as session:
            seen.clear()
            assert session.run(two) == 2
            assert seen == ["test.outer", "test.inner"]                 # outer sees the run first
            seen.clear()
            assert session.make_callable(two)() == 2
            assert seen == ["test.outer", "test.inner"]
    finally:
        patches.remove_session_layer("test.outer")
        patches.remove_session_layer("test.inner")
        patches._LAYERS.pop("test.outer", None)
        patches._LAYERS.pop("test.inner", None)


def _third_party_names(tree):
    """The names a module binds to third-party modules and classes: imported, or aliased (``tf1 = tf.compat.v1``,
    ``optimizer = tf1.train.Optimizer``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith(THIRD_PARTY)}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(THIRD_PARTY):
            names |= {a.asname or a.name for a in node.names}
    while True:
        aliases = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and _root(node.value) in names
                   for target in _flat(node.targets) if isinstance(target, ast.Name)} - names
        if not aliases:
            return names
        names |= aliases


def _flat(targets):
    """Assignment targets, tuples unpacked (``a.x, a.y = ...`` assigns to both)."""
    for target in targets:
        if isinstance(target, (ast.Tuple, ast.List)):
            yield from _flat(target.elts)
        else:
            yield target


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def test_no_module_but_the_registry_assigns_to_a_third_party_name():
    found = []
    for path in sorted(p for p in _sources() if _module_of(p) not in NAME_TABLES):
        tree = ast.parse(open(path).read())
        ours = _third_party_names(tree)
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Assign):
                targets = [t for t in _flat(node.targets) if isinstance(t, ast.Attribute)]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("setattr", "delattr") \
                    and node.args:
                targets = [node.args[0]]
            # A module's switch (TF's _PRINT_DEPRECATION_WARNINGS) is set, not a callable replaced.
            found += [f"{os.path.relpath(path, REPO)}:{node.lineno}" for t in targets if _root(t) in ours
                      and not re.fullmatch(r"_?[A-Z0-9_]+", getattr(t, "attr", "") or "")]
    assert found == [], "assignments to TF's names outside core/patches.py (register a Patch): " + ", ".join(found)


def _sources():
    for folder, _, files in os.walk(os.path.join(REPO, "tfcluster")):
        yield from (os.path.join(folder, f) for f in files if f.endswith(".py"))


def _module_of(path):
    rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel
