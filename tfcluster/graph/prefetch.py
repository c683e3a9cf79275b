"""The next step's rows fetched during this step: a batch's lookups staged one step ahead (DeepRec's SmartStage).

A step of parameter-server training with tables starts with a round trip:
the worker reads its batch, sends the ps the ids it touches and waits for
their rows before any of its own work can start. The ids of the next batch
are known long before the step ends, so :func:`stage` moves that part of the
graph one step ahead: everything from the input to the rows that crossed back
from the ps (the *stage*: ``get_next``, the ids, their crossings, each part's
gather) runs for batch ``n + 1`` while the rest of the step trains on batch
``n``. The stage's results wait in a ``StagingArea`` on the device that made
each (the rows and the batch's other features on the worker, the ids each ps
will update on that ps, so nothing crosses twice); the rest of the step reads
them from there. The step runs the stage's ``put`` with its update, and every
session primes the areas once its input runs: it clears them and puts the
first batch (training/session.py).

What it changes: a batch's rows are read from the ps up to one step before
its gradients are applied, so they may miss this worker's last update, as
rows in asynchronous training miss the other workers' updates anyway. So it is
on in asynchronous training only (a sync step's rows are of the step's
weights). A finite input ends one batch early (the staged batch is never
trained), and a restart skips the batch that was staged.

Under bfloat16 math (graph/precision.py) the rows a model multiplies cross
unstaged in bfloat16 by themselves: grappler's rewrite casts them where they
are made, on the ps. Staged, a ``StagingArea`` of fixed types reads them and
the rewrite leaves them float32 on the wire, twice the bytes; so the session
that primes the stage narrows them (:meth:`Staging.narrow_rows`) to the values
the rewrite would multiply. Their gradients keep float32.

A graph qualifies when its stage reads nothing but the input, constants and
the tables it looks up: no placeholder (a fed value belongs to its own step),
no dense weight, no control flow, no other stateful op. Otherwise it runs as
it was, and the reason is logged once.

TensorFlow is imported lazily, so importing this module stays cheap.
"""

import logging
import re
from typing import Optional

from ..core import environment
from ..core.checks import switch_from
from . import crossing, gate

log = logging.getLogger("tfcluster")

#: Stateful ops a stage may run: reading the input, and reading tables by rows.
_STAGEABLE_STATEFUL = frozenset({"IteratorGetNext", "IteratorGetNextSync", "ResourceGather", "LookupTableFindV2",
                                 "LookupTableSizeV2", "Assert"})


class Staging:
    """A graph's stage, staged: its :attr:`puts` run with every step (:meth:`attach`); :meth:`prime`, run by every
    session before its first step, empties the areas and puts the first batch."""

    def __init__(self, areas, puts, staged: int, rows=()):
        self._areas = areas         # (device, tensors, shared name) per staging area
        self.puts = puts            # one put per area, in the order of the areas
        self.staged = staged        # tensors each step reads from the areas
        self.rows = list(rows)      # the lookups' rows crossings the stage ends with (graph/crossing.py)

    def narrow_rows(self, wire: str = "bfloat16") -> int:
        """Make the staged rows that would cross in float32 travel in ``wire``; their gradients keep their way.
        A session doing bfloat16 math calls it before its first run packs them (see the module doc). Returns
        how many."""
        narrowed = 0
        for c in self.rows:
            if not c.packed and not c.wire and c.sent.dtype.name == "float32":
                c.wire = wire
                narrowed += 1
        return narrowed

    def attach(self, update) -> list:
        """Make ``update`` (a step's update, a group of ops on each device) run each area's put from one of its
        ops on the area's device, so no put signals across the wire; the puts with no such op, to run beside it."""
        # The update's control dependencies (TF's apply_gradients groups each device's updates in a NoOp, after
        # which the global step moves): ops that run late, after the gradients, on each device.
        by_device, seen = {}, set()
        todo = [update] + [t.op for t in update.inputs]
        while todo:
            op = todo.pop(0)
            if op in seen:
                continue
            seen.add(op)
            if (op is update or op.type == "NoOp") and op._get_control_flow_context() is None:   # noqa: SLF001
                by_device.setdefault(crossing.device_of(op), op)
            todo.extend(op.control_inputs)
        left = []
        for put in self.puts:
            op = by_device.get(crossing.device_of(put))
            if op is None:
                left.append(put)
            else:
                op._add_control_input(put)      # noqa: SLF001 (before any session ran the graph)
        return left

    def prime(self):
        """The op that empties every area and then puts the batch the input gives next: run by each session in a
        step of its own, once its input runs (its iterator initialised, its queue runners started)."""
        import tensorflow as tf
        tf1 = tf.compat.v1
        graph = tf1.get_default_graph()
        with graph.colocate_with(None, ignore_existing=True), tf1.name_scope("tfcluster_prefetch/"):
            clears = []
            for device, tensors, name in self._areas:
                with tf1.device(device or None):
                    clears.append(_area(tensors, name).clear())
            with tf.control_dependencies(clears):
                puts = []
                for device, tensors, name in self._areas:
                    with tf1.device(device or None):
                        puts.append(_area(tensors, name).put(tensors))
            return tf.group(*puts, name="prime")


def _area(tensors, name):
    from tensorflow.python.ops import data_flow_ops
    return data_flow_ops.StagingArea([t.dtype for t in tensors], shapes=[t.shape for t in tensors],
                                     shared_name=name, capacity=2)


def wanted(prefetch: Optional[bool] = None) -> bool:
    """Whether to stage: ``prefetch`` as given, else the switch ``TFCLUSTER_PREFETCH`` (unset: yes)."""
    if prefetch is not None:
        return bool(prefetch)
    return switch_from(environment.PREFETCH, True)


def stage(graph, worker: str) -> Optional[Staging]:
    """Stage ``graph``'s lookups one step ahead (see the module doc); None, with a logged reason, where it does
    not qualify. ``worker``: this trainer's task name, which names its staging areas on the ps (every worker has
    its own)."""
    rows = [c for c in crossing.crossings(graph) if c.kind == "rows" and not c.packed]
    if not rows:
        return None
    # A crossing's shape as its reader computes it splits its pack: it is of the staged batch too.
    ends = [c.read.op for c in rows] + [t.op for c in rows for t in c.shape_tensors()]
    ops, why = _stage_ops(ends)
    if why:
        log.info("%s: the next step's rows are not fetched ahead: %s", worker, why)
        return None
    boundary = _boundary(ops)
    if not boundary:
        return None
    for device, tensors in boundary.items():
        log.debug("prefetch: %d op(s) staged; on %s: %s", len(ops), device, ", ".join(
            f"{t.name} -> {[c.name for c in t.consumers() if c not in ops]}" for t in tensors))
    return _rewire(graph, worker, boundary, ops, rows)


def _stage_ops(ends):
    """``(the ops of the stage, why it cannot be staged or None)``: ``ends`` and everything they depend on, down
    to handles and constants."""
    stage, stack = set(), list(ends)
    while stack:
        op = stack.pop()
        if op in stage:
            continue
        if op.type in gate.PLACEHOLDERS:
            return stage, f"its lookups' ids depend on the fed value {op.name}"
        if op._get_control_flow_context() is not None:       # noqa: SLF001 (TF's only way to ask)
            return stage, f"its lookups' ids are computed inside control flow ({op.name})"
        if not op.inputs and not op.control_inputs:
            continue                                          # a handle or a constant: read, not run per step
        if op.type in ("ReadVariableOp", "VariableV2") or (op.type == "Identity" and op.inputs
                                                            and op.inputs[0].dtype._is_ref_dtype):  # noqa: SLF001
            return stage, f"its lookups' ids depend on a variable's value ({op.name})"
        if op.op_def.is_stateful and op.type not in _STAGEABLE_STATEFUL:
            return stage, f"its lookups' ids depend on the stateful op {op.name} ({op.type})"
        stage.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return stage, None


def _boundary(stage) -> dict:
    """``{device: [tensors of the stage read by ops outside it]}``, in a stable order."""
    out = {}
    for op in sorted(stage, key=lambda o: o.name):
        for t in op.outputs:
            if any(c not in stage for c in t.consumers()):
                out.setdefault(crossing.device_of(op), []).append(t)
    return out


def _area_name(worker: str, device: str) -> str:
    return "tfcluster_prefetch_" + re.sub(r"[^A-Za-z0-9_]", "_", f"{worker}_{device}")


def _rewire(graph, worker: str, boundary: dict, stage, rows) -> Staging:
    """A staging area per device of ``boundary``; every reader outside ``stage`` reads the staged tensor."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    areas, puts, staged = [], [], 0
    with graph.colocate_with(None, ignore_existing=True), tf1.name_scope("tfcluster_prefetch/"):
        for device, tensors in boundary.items():
            readers = {(c, i): k for k, t in enumerate(tensors) for c in t.consumers() if c not in stage
                       for i, x in enumerate(c.inputs) if x is t}
            name = _area_name(worker, device)
            with tf1.device(device or None):
                area = _area(tensors, name)
                put = area.put(tensors)
                if gate.task_of_device(device)[0] == gate.PS_JOB:
                    # A ps keeps the batch until the next one is in: a step whose worker part TF rejected
                    # (graph/gate.py) leaves its area as it was, so the rerun reads the same batch there.
                    got = area.peek(0)
                    with tf.control_dependencies([put]):
                        dropped = area.get(name="drop")
                    put = (dropped[0] if isinstance(dropped, (list, tuple)) else dropped).op
                else:
                    got = area.get()
                puts.append(put)
            got = got if isinstance(got, (list, tuple)) else [got]
            for (reader, index), k in readers.items():
                reader._update_input(index, got[k])  # noqa: SLF001 (before any session ran the graph)
            areas.append((device, tensors, name))
            staged += len(tensors)
        return Staging(areas, puts, staged, rows)
