"""Sparse updates of ids a lookup made distinct: no second deduplication, and every row of a step at once.

tfcluster's lookup (graph/sparse.py) sends each table part the distinct ids of
a batch and gets back one gradient row per id. Two things TF does with such a
gradient on the ps cost more than its arithmetic:

- **a second deduplication.** TF 1.x's and tf-keras's optimizers add up equal
  ids next to the variable before the update (``_deduplicate_indexed_slices``:
  a ``Unique`` and an ``UnsortedSegmentSum`` per part and step). The lookup
  marks its ids (:func:`mark_distinct`) and the optimizers skip that step for
  them (the ``sparse.distinct_updates`` patches).
- **one row at a time.** TF's CPU kernels for a sparse update
  (``SparseApplyAdagrad``, ``SparseApplyFtrl``, ``SparseApplyMomentum`` and
  their resource forms) walk the ids in turn, reading, updating and
  writing each row of the variable and of each slot before they touch the next.
  A row of a big table is a cache miss, so the kernel waits on memory once per
  row and slot: on 2 ps + 2 workers of the click-through bench the two
  expressions of ``SparseApplyAdagrad`` took 11% of the machine's CPU (perf,
  docs/embeddings.md). Where the ids are distinct, :func:`at_once` makes the
  same rule a gather of the step's rows of the variable and of each slot (their
  misses overlap), elementwise math over them, and a scatter of each back: for
  2,600 rows of 16 floats of a 1.3-million-row table, Adagrad 0.42 ms against
  the kernel's 0.76 and Ftrl 0.83 against 1.9 (one process, one thread). A row
  of one number the kernel updates in a flat loop, faster than three ops
  (Adagrad 0.22 against 0.33 ms), so it keeps those, as it keeps every update
  made with ``use_locking=True``, whose kernel holds the variable throughout:
  tf-keras's optimizers always ask for it, so they keep TF's kernels.

What the second changes: without ``use_locking`` TF's kernel updates a row while
other workers' updates of the same row may run beside it (asynchronous training
is Hogwild on the ps), and it reads and writes each row within nanoseconds; here
the rows of an update are read together and written together a fraction of a
millisecond later, so another worker's update of the same row in between is
overwritten. Async training already applies gradients of rows that others
changed meanwhile; docs/embeddings.md measures the held-out AUC either way.
Ids that may repeat (a sync step's rows from several workers, a program's own
``IndexedSlices``) keep TF's deduplication and kernels.

TensorFlow is imported lazily, so importing this module stays cheap.
"""

import functools
import inspect
import re
import weakref
from dataclasses import dataclass
from typing import Callable, Tuple

from ..core import patches

#: The ids tensors tfcluster's lookups made distinct, by graph: a sparse update of such ids needs no second
#: deduplication next to its variable (``{graph: set of tensor names}``).
_DISTINCT = weakref.WeakKeyDictionary()


def mark_distinct(ids):
    """Note that ``ids`` (a tensor) holds no id twice: a gradient indexed by it needs no summing of duplicates."""
    _DISTINCT.setdefault(ids.graph, set()).add(ids.name)


def is_distinct(indices) -> bool:
    """True when ``indices`` is a tensor :func:`mark_distinct` noted."""
    graph = getattr(indices, "graph", None)
    return graph is not None and getattr(indices, "name", None) in _DISTINCT.get(graph, ())


# ------------------------------------------------------------------ no second deduplication
def applying_distinct(apply):
    """An optimizer's ``_resource_apply_sparse_duplicate_indices`` that skips TF's summing of duplicate ids
    where tfcluster's lookup made them distinct (a unique and a segment sum on the ps, every step)."""
    @functools.wraps(apply)
    def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices, **kwargs):
        if is_distinct(indices):
            return self._resource_apply_sparse(grad, handle, indices, **kwargs)
        return apply(self, grad, handle, indices, **kwargs)
    _resource_apply_sparse_duplicate_indices.__wrapped__ = apply
    return _resource_apply_sparse_duplicate_indices


def applying_distinct_ref(apply):
    """The same for reference variables' ``_apply_sparse_duplicate_indices``."""
    @functools.wraps(apply)
    def _apply_sparse_duplicate_indices(self, grad, var):
        if is_distinct(grad.indices):
            return self._apply_sparse(grad, var)
        return apply(self, grad, var)
    _apply_sparse_duplicate_indices.__wrapped__ = apply
    return _apply_sparse_duplicate_indices


# ------------------------------------------------------------------ every row at once
def _adagrad(t, rows, g):
    a = rows["accum"] + g * g if t.get("update_slots", True) else rows["accum"]
    return {"accum": a, "var": rows["var"] - t["lr"] * g * _tf().math.rsqrt(a)}


def _ftrl(t, rows, g):
    """TF's sparse Ftrl (``ComputeFtrl`` in training_ops.cc): the accumulator grows by the gradient's square; the
    linear term takes the gradient with l2 shrinkage (FtrlV2), optionally times the learning rate."""
    tf = _tf()
    v, a, lin = rows["var"], rows["accum"], rows["linear"]
    by_lr = t.get("multiply_linear_by_lr", False)
    shrunk = g + 2.0 * t["l2_shrinkage"] * v if "l2_shrinkage" in t else g
    new_a = a + g * g
    if tf.get_static_value(t["lr_power"]) == -0.5:
        power, old = tf.sqrt(new_a), tf.sqrt(a)
    else:
        power, old = tf.pow(new_a, -t["lr_power"]), tf.pow(a, -t["lr_power"])
    if by_lr:
        lin = lin + (shrunk * t["lr"] - (power - old) * v)
        l1, quadratic = t["l1"] * t["lr"], power + 2.0 * t["l2"] * t["lr"]
    else:
        lin = lin + (shrunk - (power - old) / t["lr"] * v)
        l1, quadratic = t["l1"], power / t["lr"] + 2.0 * t["l2"]
    return {"var": (tf.clip_by_value(lin, -l1, l1) - lin) / quadratic, "accum": new_a, "linear": lin}


def _momentum(t, rows, g):
    a = rows["accum"] * t["momentum"] + g
    if t.get("use_nesterov", False):
        return {"accum": a, "var": rows["var"] - (t["lr"] * g + t["lr"] * t["momentum"] * a)}
    return {"accum": a, "var": rows["var"] - t["lr"] * a}


@dataclass(frozen=True)
class Rule:
    """One of TF's sparse update ops made at once: its inputs, the variable and slots among them, and the rule."""
    op: str                         #: TF's op ("ResourceSparseApplyAdagrad")
    inputs: Tuple[str, ...]         #: its leading inputs by name, as TF's op function takes them
    state: Tuple[str, ...]          #: those that are the variable and its slots, the variable first
    rule: Callable                  #: ``(inputs, rows of each state, grad) -> new rows of each state``

    @property
    def resource(self) -> bool:
        """True for the ops on resource variables (their state inputs are handles)."""
        return self.op.startswith("Resource")

    @property
    def function(self) -> str:
        """The op's function in ``gen_training_ops`` ("resource_sparse_apply_adagrad")."""
        return re.sub(r"(?<!^)(?=[A-Z])", "_", self.op).lower()


_ADAGRAD = ("var", "accum", "lr", "grad", "indices")
_FTRL = ("var", "accum", "linear", "grad", "indices", "lr", "l1", "l2")
_MOMENTUM = ("var", "accum", "lr", "grad", "indices", "momentum")
#: TF's ops a step of distinct ids applies at once (:func:`at_once`), by name: TF 1.x's Adagrad, Ftrl and Momentum,
#: on resource and reference variables. (tf-keras's optimizers always ask for locking: they keep TF's kernels.)
RULES = {f"{kind}{op}": Rule(f"{kind}{op}", inputs, inputs[:3 if "linear" in inputs else 2], rule)
         for kind in ("Resource", "")
         for op, inputs, rule in (("SparseApplyAdagrad", _ADAGRAD, _adagrad),
                                  ("SparseApplyFtrl", _FTRL + ("lr_power",), _ftrl),
                                  ("SparseApplyFtrlV2", _FTRL + ("l2_shrinkage", "lr_power"), _ftrl),
                                  ("SparseApplyMomentum", _MOMENTUM, _momentum))}


def _tf():
    import tensorflow as tf
    return tf


def _applies_at_once(inputs) -> bool:
    """Distinct ids, rows of 2 numbers or more, no ``use_locking``: where :func:`at_once` makes the update."""
    grad = inputs["grad"]
    width = grad.shape[1:].num_elements() if getattr(grad, "shape", None) is not None and grad.shape.rank else None
    return is_distinct(inputs["indices"]) and not inputs.get("use_locking", False) and (width or 0) >= 2


def at_once(rule: Rule, inputs: dict):
    """``rule``'s update of ``inputs`` (the op's arguments by name) as gathers, math and scatters: an ``Operation``
    for a resource op, the variable's updated ref for a reference one (what TF's op function returns)."""
    tf = _tf()
    from tensorflow.python.ops import gen_state_ops, resource_variable_ops
    grad, ids = inputs["grad"], inputs["indices"]
    if rule.resource:
        rows = {name: resource_variable_ops.resource_gather(inputs[name], ids, dtype=grad.dtype)
                for name in rule.state}
    else:
        rows = {name: tf.gather(inputs[name], ids) for name in rule.state}
    new = rule.rule(inputs, rows, grad)
    if rule.resource:
        writes = [resource_variable_ops.resource_scatter_update(inputs[name], ids, new[name]) for name in rule.state]
        return tf.group(*writes, name=inputs.get("name"))
    slots = [gen_state_ops.scatter_update(inputs[name], ids, new[name], use_locking=False) for name in rule.state[1:]]
    with tf.control_dependencies(slots):
        return gen_state_ops.scatter_update(inputs["var"], ids, new["var"], use_locking=False,
                                            name=inputs.get("name"))


def making_at_once(rule: Rule):
    """A wrap for TF's function of ``rule``'s op: the update at once (:func:`at_once`) where it applies, else TF's."""
    def wrap(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def apply(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            if _applies_at_once(bound.arguments):
                return at_once(rule, dict(bound.arguments))
            return original(*args, **kwargs)
        apply.__wrapped__ = original
        return apply
    return wrap


_WHERE = "fit's ps strategies, the Estimator, TF1 mode"
patches.register(patches.Patch(
    "sparse.distinct_updates", "tensorflow.python.training.optimizer:Optimizer._resource_apply_sparse_duplicate_indices",
    "a sparse update of ids tfcluster's lookup made distinct skips TF's second deduplication (a unique and a segment "
    "sum next to the variable, every step)", applying_distinct, _WHERE, params=("self", "grad", "handle", "indices")))
patches.register(patches.Patch(
    "sparse.distinct_updates_ref", "tensorflow.python.training.optimizer:Optimizer._apply_sparse_duplicate_indices",
    "the same for reference variables (TF 1.x programs)", applying_distinct_ref, _WHERE, params=("self", "grad", "var")))
patches.register(patches.Patch(
    "sparse.distinct_updates_keras",
    "tf_keras.src.optimizers.legacy.optimizer_v2:OptimizerV2._resource_apply_sparse_duplicate_indices",
    "the same for tf-keras's graph-mode optimizers", applying_distinct, _WHERE,
    params=("self", "grad", "handle", "indices"), optional=True))
for _rule in RULES.values():
    patches.register(patches.Patch(
        f"sparse.at_once.{_rule.op}", f"tensorflow.python.ops.gen_training_ops:{_rule.function}",
        "an update of distinct ids in rows of 2 numbers or more, without use_locking, is a gather, elementwise math "
        "and a scatter per variable and slot: every row at once, not one row after another", making_at_once(_rule),
        _WHERE, params=_rule.inputs))


def install(keras: bool = False):
    """Updates of distinct ids without a second deduplication and with every row at once (idempotent, per
    process); ``keras``: tf-keras's optimizers too (where the program uses tf-keras, never imported for it)."""
    patches.install("sparse.distinct_updates")
    patches.install("sparse.distinct_updates_ref")
    for op in RULES:
        patches.install(f"sparse.at_once.{op}")
    if keras:
        patches.install("sparse.distinct_updates_keras")
