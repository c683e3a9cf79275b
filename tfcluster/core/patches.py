"""Every change tfcluster makes to a third-party callable (TensorFlow, tf-keras, tensorflow-estimator), in one registry.

TF 1.x code and the runtime it needs from TF 2.21 meet in places TF offers no
hook for (``Saver.restore``, ``embedding_lookup``, ``SessionManager``); there
tfcluster replaces the callable with one that wraps TF's own. Each replacement
is a :class:`Patch`: it names its target (``"module:Owner.attr"``), says why,
and is installed by :func:`install` once per process, from the entry point that
needs it (``fit``'s strategies, the Estimator, TF1 mode: docs/patches.md lists
them), or for the length of a ``with`` by :func:`applied`. :func:`uninstall`
puts TF's own back (the tests use it); :func:`original` is TF's callable
whatever is installed; :func:`table` is docs/patches.md's table, and
tests/test_patches.py checks that every target exists with the parameters its
patch expects on the pinned versions.

``Session.run`` is changed by two rules (false-duplicate reruns, the sync
step's wait after a push), so it is wrapped once, as an ordered chain of
:class:`SessionLayer`\\ s (:func:`add_session_layer`): the innermost layer
sees TF's run, whatever order the rules were installed in.

TensorFlow is imported only when a patch is installed.
"""

import contextlib
import functools
import importlib
import inspect
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional, Tuple

_MISSING = object()


@dataclass(frozen=True)
class Patch:
    """One replacement of a third-party callable: ``wrap(original, *args)`` becomes ``target``."""
    name: str                       #: short, unique: "sparse.distinct_lookup"
    target: str                     #: "tensorflow.python.ops.embedding_ops:embedding_lookup"
    why: str                        #: one line, for docs/patches.md
    wrap: Callable                  #: TF's callable (and install's arguments) -> its replacement
    installed_by: str               #: the entry point(s) that install it
    params: Optional[Tuple[str, ...]] = None   #: the original's leading parameter names the wrapper relies on
    also: Tuple[str, ...] = ()      #: other names holding the same callable (replaced while they still hold it)
    optional: bool = False          #: a target TF does not have is left alone, not an error
    adds: bool = False              #: a name TF removed, served again: ``wrap(None)`` makes it; left alone where TF has it


@dataclass
class _Installed:
    original: object
    replacement: object
    own: bool                       # the owner held the attribute itself (not inherited): put back, not deleted
    args: tuple = ()
    aliases: list = field(default_factory=list)


_REGISTRY = {}
_INSTALLED = {}
_lock = threading.RLock()


def register(patch: Patch) -> Patch:
    """Add ``patch`` to the registry (at import of the module that owns it); returns it."""
    with _lock:
        known = _REGISTRY.get(patch.name)
        if known is not None and known.target != patch.target:
            raise ValueError(f"patch name {patch.name!r} is taken by {known.target}")
        _REGISTRY[patch.name] = patch
    return patch


def registered():
    """Every registered patch, by name (registration order is import order, which varies)."""
    with _lock:
        return sorted(_REGISTRY.values(), key=lambda patch: patch.name)


def resolve(target: str):
    """``(owner, attribute name)`` of a ``"module:Owner.attr"`` target (imports the module)."""
    module_name, _, path = target.partition(":")
    owner = importlib.import_module(module_name)
    *parts, attr = path.split(".")
    for part in parts:
        owner = getattr(owner, part)
    return owner, attr


def _current(target: str):
    owner, attr = resolve(target)
    return owner, attr, getattr(owner, attr, _MISSING)


def install(name: str, *args) -> bool:
    """Install the registered patch ``name`` (once per process: later calls do nothing); True when installed now."""
    with _lock:
        if name in _INSTALLED:
            return False
        patch = _REGISTRY[name]
        try:
            owner, attr, original = _current(patch.target)
        except (ImportError, AttributeError):
            if patch.optional:
                return False
            raise
        if patch.adds:
            if original is not _MISSING:        # this TensorFlow has the name again: its own stays
                return False
            original = None
        elif original is _MISSING:
            if patch.optional:
                return False
            raise AttributeError(f"{patch.target} does not exist: patch {name} cannot be installed")
        replacement = patch.wrap(original, *args)
        if original is not None and getattr(replacement, "__wrapped__", None) is None:
            try:
                functools.update_wrapper(replacement, original)
            except (AttributeError, TypeError):
                pass
        own = original is not None and (attr in vars(owner) if inspect.isclass(owner) else True)
        done = _Installed(original, replacement, own, args)
        setattr(owner, attr, replacement)
        for alias in patch.also:
            try:
                a_owner, a_attr, held = _current(alias)
            except (ImportError, AttributeError):
                continue
            if held is original:
                setattr(a_owner, a_attr, replacement)
                done.aliases.append((a_owner, a_attr))
        _INSTALLED[name] = done
        return True


def uninstall(name: str):
    """Put back what :func:`install` replaced for ``name`` (nothing if it is not installed)."""
    with _lock:
        done = _INSTALLED.pop(name, None)
        if done is None:
            return
        patch = _REGISTRY[name]
        owner, attr = resolve(patch.target)
        if done.own:
            setattr(owner, attr, done.original)
        else:
            delattr(owner, attr)
        for a_owner, a_attr in done.aliases:
            setattr(a_owner, a_attr, done.original)


def installed(name: str) -> bool:
    """True when the patch ``name`` is installed in this process."""
    return name in _INSTALLED


def original(name: str):
    """The third-party callable behind patch ``name``: TF's own, installed or not (None: TF has no such name)."""
    with _lock:
        done = _INSTALLED.get(name)
        if done is not None:
            return done.original
        value = _current(_REGISTRY[name].target)[2]
        return None if value is _MISSING else value


@contextlib.contextmanager
def applied(name: str, *args):
    """Patch ``name`` installed for the length of the ``with`` (a context-scoped patch)."""
    now = install(name, *args)
    try:
        yield
    finally:
        if now:
            uninstall(name)


@contextlib.contextmanager
def taken_out(*names: str):
    """The patches ``names`` out (TF's own callables back) for the ``with``, then as they were (for tests)."""
    with _lock:
        was = {name: _INSTALLED[name].args for name in names if name in _INSTALLED}
        for name in names:
            uninstall(name)
    try:
        yield
    finally:
        with _lock:
            for name in names:
                uninstall(name)
                if name in was:
                    install(name, *was[name])


# ------------------------------------------------------------------ Session.run, once, as a chain
@dataclass(frozen=True)
class SessionLayer:
    """One rule around every ``Session.run`` (and the callables sessions make): ``wrap(session, fn) -> fn``."""
    name: str
    order: int                      #: lower runs nearer TF's run
    why: str
    wrap: Callable
    installed_by: str
    entries: Tuple[str, ...] = ("run", "make_callable")   #: which of SESSION_ENTRIES it wraps


#: The session methods the chain wraps: a step (``run``) and the two makers of step callables.
SESSION_ENTRIES = ("run", "make_callable", "_make_callable_from_options")
_LAYERS = {}
#: The layers in the chain, innermost first: replaced whole, never changed in place, so a run on another
#: thread reads either the old chain or the new one (list.sort empties a list while it sorts).
_ACTIVE = ()


def _layers(entry):
    return [layer for layer in _ACTIVE if entry in layer.entries]


def _chained_run(original):
    def run(self, *args, **kwargs):
        call = functools.partial(original, self)
        for layer in _layers("run"):
            call = layer.wrap(self, call)
        return call(*args, **kwargs)
    return run


def _chained_maker(entry):
    def wrap(original):
        def make(self, *args, **kwargs):
            made = original(self, *args, **kwargs)
            for layer in _layers(entry):
                made = layer.wrap(self, made)
            return made
        return make
    return wrap


_SESSION = "tensorflow.python.client.session:BaseSession."
for _entry, _wrap in (("run", _chained_run), ("make_callable", _chained_maker("make_callable")),
                      ("_make_callable_from_options", _chained_maker("_make_callable_from_options"))):
    register(Patch(f"session.{_entry}", _SESSION + _entry,
                   "one chain of tfcluster's session layers (below) around every step and step callable",
                   _wrap, "the first session layer added", params=("self",)))


def register_session_layer(layer: SessionLayer) -> SessionLayer:
    """Add ``layer`` to the registry of session layers (at import of the module that owns it)."""
    with _lock:
        _LAYERS[layer.name] = layer
    return layer


def add_session_layer(name: str) -> bool:
    """Put the registered layer ``name`` into every session's chain (once per process); True when added now."""
    global _ACTIVE
    with _lock:
        layer = _LAYERS[name]
        if layer in _ACTIVE:
            return False
        for entry in SESSION_ENTRIES:
            install(f"session.{entry}")
        _ACTIVE = tuple(sorted(_ACTIVE + (layer,), key=lambda one: one.order))
        return True


def remove_session_layer(name: str):
    """Take layer ``name`` out of the chain; the chain goes with its last layer (the tests use it)."""
    global _ACTIVE
    with _lock:
        _ACTIVE = tuple(layer for layer in _ACTIVE if layer.name != name)
        if not _ACTIVE:
            for entry in SESSION_ENTRIES:
                uninstall(f"session.{entry}")


def session_layers():
    """Every registered session layer, innermost first."""
    with _lock:
        return sorted(_LAYERS.values(), key=lambda one: one.order)


def table() -> str:
    """docs/patches.md's table: every patch and session layer, its target, why, and who installs it."""
    rows = ["| patch | target | why | installed by |", "|---|---|---|---|"]
    for p in registered():
        target = p.target + "".join(f", {a}" for a in p.also)
        rows.append(f"| `{p.name}` | `{target}` | {p.why} | {p.installed_by} |")
    rows += ["", "| session layer (innermost first) | wraps | why | installed by |", "|---|---|---|---|"]
    for layer in session_layers():
        rows.append(f"| `{layer.name}` | {', '.join(f'`{e}`' for e in layer.entries)} | {layer.why} | "
                    f"{layer.installed_by} |")
    return "\n".join(rows) + "\n"
