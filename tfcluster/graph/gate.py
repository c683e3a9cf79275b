"""A trainer's step reads its input only once every ps of the step has taken the step.

TF runs a step as one part per task: the master sends each task its part in a
``RunGraph`` request and the parts run at once, passing tensors to each other.
A task may reject its part before running any of it: TF 2.21's false duplicate
(:mod:`tfcluster.core.duplicates`), after which the master cancels the other
parts and the step is run again. By then a trainer's part may have taken its
batch (an iterator's ``get_next``, a queue's dequeue, a staged batch), and
nothing gives it back: the rerun trained the next batch, and with lookups
staged one step ahead (:mod:`.prefetch`) the staging areas on the worker and on
the ps fell out of step, so the rerun failed in the pack's split or applied one
batch's gradients to another's rows (issue 67).

So, before a session first runs a graph, each op on a trainer that takes the
next of its input (:data:`INPUT_READS`) and feeds what the trainer sends a ps
waits for a *ticket* from every ps its step deals with: a tensor that ps makes
from no *source* (no stateful op but a variable's read, no fed value) and that
the trainer reads anyway to make what it sends back, such as a weight's read,
which leaves the ps as soon as its part runs. The trainer reads the ticket
beside that reader, so TF's runtime receives it once and nothing more travels.
A ps that sends the trainer nothing of the kind (it holds only tables, whose
rows depend on the ids sent) gives one row of one of its variables. A part
that a ps rejected thus takes nothing on the trainer: the rerun reads what the
rejected step would have. A trainer's own part rejected runs nothing there,
and the staged ids its ps's parts read are peeked, and let go only once the
next batch's ids arrived (:mod:`.prefetch`). Random draws are not gated: a
rerun draws new numbers (a dropout mask is any draw), and a random op may make
a variable's first value, in a run before the ps holds anything to read.

What it costs: an unstaged step's input is read once the ps's first tensor has
arrived rather than while it travels (docs/pitfalls.md, item 15, has the
measured figure); a staged step reads its next batch during this one either
way. Ps tasks are the tasks of the job named ``ps`` (tfcluster's and TF 1.x's
name); a graph with none is left as it is.

This module also says what a source is, for the packs of :mod:`.crossing`.
TensorFlow is imported lazily, so importing this module stays cheap.
"""

import threading
import weakref

from ..topology.cluster import Task

#: Stateful ops that are no source: reading (or naming) a variable or a table changes nothing.
NOT_SOURCES = frozenset({"VarHandleOp", "ReadVariableOp", "VariableV2", "Variable", "VarIsInitializedOp",
                         "ResourceGather", "ResourceGatherNd", "LookupTableFindV2", "LookupTableSizeV2",
                         "HashTableV2", "MutableHashTableV2", "MutableDenseHashTable",
                         "MutableHashTableOfTensorsV2", "Const"})
#: Ops whose value is fed: each step its own (so neither packed with another step's nor staged ahead).
PLACEHOLDERS = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"})
#: What takes the next of a trainer's input away: a dataset's, a queue's, a staging area's (DeepRec's tf.staged,
#: graph/prefetch.py). Not random ops (see the module doc).
INPUT_READS = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional",
                         "QueueDequeue", "QueueDequeueV2", "QueueDequeueMany", "QueueDequeueManyV2",
                         "QueueDequeueUpTo", "QueueDequeueUpToV2", "Unstage", "MapUnstage", "MapUnstageNoKey",
                         "OrderedMapUnstage", "OrderedMapUnstageNoKey"})
#: The job whose tasks hold the variables: the tasks whose parts a trainer's input reads wait for.
PS_JOB = "ps"


def is_source(op) -> bool:
    """True for an op a step reads state or a fed value through: a placeholder, or a stateful op that is not a
    variable's or table's read."""
    return op.type in PLACEHOLDERS or (op.op_def is not None and op.op_def.is_stateful
                                       and op.type not in NOT_SOURCES)


def in_control_flow(op) -> bool:
    """True for an op inside a ``while`` or ``cond`` (no control edge may cross into or out of one)."""
    return op._get_control_flow_context() is not None  # noqa: SLF001 (TF's only way to ask)


_TASKS = {}         # device name -> (job, task): a graph names few devices, each parsed once


def task_of_device(device: str):
    """``(job, task index)`` of a device name (``(None, None)`` where it names no job): :meth:`Task.of_device`,
    as a tuple, remembered (the walks ask it of every op)."""
    task = _TASKS.get(device)
    if task is None:
        named = Task.of_device(device)
        task = _TASKS[device] = (None, None) if named is None else (named.job, named.index)
    return task


class Walk:
    """A value for each op, made from its inputs' values (data and control inputs) by ``value(op, values)``,
    memoised over one pass; a loop's back edge (NextIteration -> Merge) gives ``empty``."""

    def __init__(self, value, empty):
        self.value, self.empty, self.memo = value, empty, {}

    def of(self, op):
        """``op``'s value."""
        stack, visiting = [(op, False)], set()
        while stack:
            node, ready = stack.pop()
            if node.name in self.memo:
                continue
            inputs = [t.op for t in node.inputs] + list(node.control_inputs)
            if not ready:
                if node.name in visiting:       # a loop's back edge: walked already
                    continue
                visiting.add(node.name)
                stack.append((node, True))
                stack.extend((i, False) for i in inputs if i.name not in self.memo)
                continue
            # An input still being walked is the loop's own: it adds nothing.
            self.memo[node.name] = self.value(node, [self.memo.get(i.name, self.empty) for i in inputs])
        return self.memo[op.name]


def source_walk() -> Walk:
    """A walk that gives each op its sources: the source ops it depends on, itself included."""
    def value(op, inputs):
        found = frozenset().union(*inputs)
        return found | {op} if is_source(op) else found
    return Walk(value, frozenset())


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.version = 0            # the graph's last op id when it was last gated: later ops are new
        self.tickets = {}           # (trainer, ps) -> the ticket op on the trainer


class PerGraph:
    """``state(graph)``: a graph's own state, made by ``make()`` the first time it is asked for, gone with the
    graph."""

    def __init__(self, make):
        self.make = make
        self._states = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, graph):
        with self._lock:
            state = self._states.get(graph)
            if state is None:
                state = self._states[graph] = self.make()
            return state


_state = PerGraph(_State)


def pending(graph) -> bool:
    """True when ``graph`` has ops added since it was last gated."""
    return graph.version > _state(graph).version


def _reads_input(op) -> bool:
    """An op that takes the next of the input (a batch, a staged batch) away for good, outside any loop."""
    return op.type in INPUT_READS and not in_control_flow(op)


def gate(graph) -> int:
    """Make the new ops of ``graph`` that read state on a trainer wait for a ticket from each ps their step deals
    with (see the module doc); returns how many ops wait now. Idempotent: an op already sent to a session (an
    older one) is never changed."""
    state = _state(graph)
    with state.lock:
        if graph.finalized or graph.version <= state.version:
            return 0
        first_new, state.version = state.version, graph.version
        ops = graph.get_operations()
        # Most runs that bring new ops bring none a trainer reads state with (a program that adds ops as it goes,
        # a hook's read): those cost a look at the new ops alone.
        if not any(op._id > first_new and op.device and task_of_device(op.device)[0] not in (None, PS_JOB)  # noqa: SLF001
                   and _reads_input(op) for op in ops):
            return 0
        walk = source_walk()
        edges, gated, deals = [], {}, {}
        for op in ops:
            if not op.device or in_control_flow(op):
                continue
            here = task_of_device(op.device)
            for t in op.inputs:
                there = task_of_device(t.op.device)
                if there[0] is None or there == here or in_control_flow(t.op):
                    continue
                if there[0] == PS_JOB and here[0] != PS_JOB:            # a ps -> trainer edge
                    deals.setdefault(here, set()).add(there)
                    edges.append((t, op))
                elif here[0] == PS_JOB and there[0] != PS_JOB:          # a trainer -> ps edge
                    deals.setdefault(there, set()).add(here)
                    for s in walk.of(t.op):
                        if s._id > first_new and task_of_device(s.device) == there and _reads_input(s):  # noqa: SLF001
                            gated.setdefault(there, set()).add(s)
        readers = _readers(edges, walk, {trainer: _sending(graph, trainer) for trainer in gated})
        count = 0
        for trainer, ops in gated.items():
            tickets = [_ticket(graph, state, trainer, ps, readers.get((trainer, ps)))
                       for ps in sorted(deals[trainer])]
            tickets = [t for t in tickets if t is not None]
            for op in sorted(ops, key=lambda o: o.name):
                for ticket in tickets:
                    if ticket not in op.control_inputs:
                        op._add_control_input(ticket)  # noqa: SLF001 (before any session ran it)
                count += 1
        return count


def _sending(graph, trainer) -> set:
    """The names of ``trainer``'s ops that what it sends a ps depends on (the step's own reads among them)."""
    stack = [t.op for op in graph.get_operations() if task_of_device(op.device)[0] == PS_JOB
             for t in op.inputs if task_of_device(t.op.device) == trainer]
    seen = set()
    while stack:
        op = stack.pop()
        if op.name in seen or task_of_device(op.device) != trainer:
            continue
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def _readers(edges, walk, sending) -> dict:
    """``{(trainer, ps): (tensor, device of its reader)}``: for each pair, the first tensor the ps makes from no
    source that the trainer reads in order to send the ps something (a weight its gradients need); a tensor the
    trainer reads for no such purpose (a table's whole read nothing uses) would travel for the ticket alone."""
    out = {}
    for t, reader in edges:
        trainer, ps = task_of_device(reader.device), task_of_device(t.op.device)
        if trainer not in sending or (trainer, ps) in out or reader.name not in sending[trainer]:
            continue
        if t.dtype.base_dtype.name not in ("resource", "variant") and t.op.type != "Const" and not walk.of(t.op):
            out[(trainer, ps)] = (t, reader.device)
    return out


def _ticket(graph, state, trainer, ps, reader):
    """The op on ``trainer`` that reads ``ps``'s ticket (made once per pair), or None where ``ps`` has nothing
    to give one from."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    key = (trainer, ps)
    if key not in state.tickets:
        job, index = ps
        with graph.colocate_with(None, ignore_existing=True), tf1.name_scope(f"tfcluster_gate/{job}_{index}/"):
            if reader is not None:
                tensor, device = reader
            else:
                tensor = _one_row(graph, ps)
                device = f"/job:{trainer[0]}/task:{trainer[1]}"
            with tf1.device(device):
                state.tickets[key] = None if tensor is None else tf.identity(tensor, name="ticket").op
    return state.tickets[key]


def _one_row(graph, ps):
    """One row of a variable on ``ps`` read there (a ticket from a ps that sends nothing without a source)."""
    import tensorflow as tf
    from tensorflow.python.ops import gen_resource_variable_ops
    for op in graph.get_operations():
        if task_of_device(op.device) != ps or in_control_flow(op):
            continue
        if op.type == "VarHandleOp" and op.get_attr("shape").dim:
            with tf.compat.v1.device(op.device):
                return gen_resource_variable_ops.resource_gather(op.outputs[0], [0], dtype=op.get_attr("dtype"))
        if op.type == "VariableV2" and op.get_attr("shape").dim:
            with tf.compat.v1.device(op.device):
                return tf.gather(op.outputs[0], [0])
    return None
