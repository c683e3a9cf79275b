"""What a step moves between tasks, read from a traced step (``RunOptions.FULL_TRACE``).

TF's distributed runtime records every tensor one task receives from another
as a ``RecvTensor`` entry in the step's stats, with the bytes it allocated for
it (``output.tensor_description.allocation_description.requested_bytes``) and
a label ``... edge_N_<op name> from <device> to <device>``. :func:`step_traffic`
turns a step's ``RunMetadata`` into :class:`Transfer` records;
:class:`TrafficHook` traces a few steps of a training loop and keeps their
mean per step, so a test or the bench states bytes per step as measured, not
as a model of what should travel. The same stats name the ops each task ran
(``<node> = <OpType>(...)``): :meth:`StepTraffic.ops_on` counts them per step,
and :meth:`StepTraffic.updates_on` the variables a task updated by rows, so
"one sparse update per ps per step" is measured the same way. They are not
always whole: a ps's two table parts showed one ``ResourceGather`` a step
(docs/embeddings.md, C9), so count an op only where a test has checked it.

TensorFlow is not imported here.
"""

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

from ..topology.cluster import Task
from .step import Hook, RunArgs

_LABEL = re.compile(r"edge_\d+_(?P<tensor>\S+) from (?P<src>\S+) to (?P<dst>\S+)")
_OP = re.compile(r"^\S+ = (?P<type>[A-Za-z0-9_]+)\(")
#: Op types that write a variable's rows: TF's sparse updates, and the scatters of an update made at once
#: (graph/sparse_updates.py: one for the variable and one for each slot, in the scope TF's optimizers give the
#: variable's update, ``.../update_<variable>/``: an update is the ops of one scope).
UPDATES = ("SparseApply", "ResourceSparseApply", "ResourceScatterUpdate", "ResourceScatterAdd", "ResourceScatterSub",
           "ScatterUpdate", "ScatterAdd", "ScatterSub")


def task_of(device: str) -> str:
    """``/job:ps/replica:0/task:1/device:CPU:0`` -> ``ps:1`` (``?:0`` for a device of no job)."""
    task = Task.of_device(device)
    return "?:0" if task is None else str(task)


@dataclass(frozen=True)
class Transfer:
    """One tensor received by one task from another in one step."""

    tensor: str     # the sending op's name
    src: str        # ``ps:0``
    dst: str        # ``worker:1``
    nbytes: int


class StepTraffic:
    """The transfers of one step (or the mean of several), between tasks only, and the ops each task ran."""

    def __init__(self, transfers, steps: int = 1, ops=(), writes=()):
        self.transfers = tuple(transfers)
        self.steps = steps
        self.ops = tuple(ops)       # (task, op type), one per op run
        self.writes = tuple(writes)     # (task, the update it belongs to), one per op that wrote rows

    def _sum(self, keep) -> float:
        return sum(t.nbytes for t in self.transfers if keep(t)) / self.steps

    def received_by(self, job_or_task: str) -> float:
        """Bytes per step received by ``worker:0`` (a task) or ``ps`` (a whole job)."""
        return self._sum(lambda t: _matches(t.dst, job_or_task))

    def sent_by(self, job_or_task: str) -> float:
        """Bytes per step sent by a task or a whole job."""
        return self._sum(lambda t: _matches(t.src, job_or_task))

    def between(self, src: str, dst: str) -> float:
        """Bytes per step from ``src`` to ``dst`` (tasks or jobs)."""
        return self._sum(lambda t: _matches(t.src, src) and _matches(t.dst, dst))

    def by_task(self) -> dict:
        """``{task: (bytes received, bytes sent)}`` per step, for every task that took part."""
        out = defaultdict(lambda: [0.0, 0.0])
        for t in self.transfers:
            out[t.dst][0] += t.nbytes / self.steps
            out[t.src][1] += t.nbytes / self.steps
        return {k: tuple(v) for k, v in sorted(out.items())}

    def tensors(self, src: str, dst: str, carrying: bool = False) -> float:
        """Tensors per step received by ``dst`` from ``src`` (tasks or jobs): one ``RecvTensor`` call each;
        ``carrying``: only those that carry bytes (not the empty tensors of a control dependency across tasks)."""
        return sum(1 for t in self.transfers if _matches(t.src, src) and _matches(t.dst, dst)
                   and (t.nbytes or not carrying)) / self.steps

    def ops_on(self, job_or_task: str) -> dict:
        """``{op type: runs per step}`` of a task, or of each task of a job on average."""
        tasks = {task for task, _ in self.ops if _matches(task, job_or_task)}
        counts = defaultdict(float)
        for task, kind in self.ops:
            if task in tasks:
                counts[kind] += 1 / (self.steps * len(tasks))
        return {kind: round(n, 3) for kind, n in sorted(counts.items())}

    def updates_on(self, job_or_task: str) -> float:
        """Variables a task updated by rows per step (a job's tasks on average): an update made of several ops
        (a variable's and its slots' scatters) counts once."""
        tasks = {task for task, _ in self.ops if _matches(task, job_or_task)}
        return round(sum(1 for task, _ in set(self.writes) if task in tasks) / (self.steps * max(len(tasks), 1)), 3)

    def largest(self, n: int = 5, where: Optional[str] = None) -> list:
        """The ``n`` biggest transfers (per step), optionally only those received by ``where``."""
        rows = defaultdict(float)
        for t in self.transfers:
            if where is None or _matches(t.dst, where):
                rows[(t.tensor, t.src, t.dst)] += t.nbytes / self.steps
        return sorted(rows.items(), key=lambda kv: -kv[1])[:n]

    def __repr__(self):
        return f"StepTraffic({len(self.transfers)} transfers over {self.steps} step(s))"


def _matches(task: str, job_or_task: str) -> bool:
    return task == job_or_task if ":" in job_or_task else task.split(":")[0] == job_or_task


def step_traffic(run_metadata) -> StepTraffic:
    """The tensors received between tasks in the step of ``run_metadata`` (traced with FULL_TRACE), and the ops
    each task ran."""
    transfers, ops, writes = [], [], []
    for dev in run_metadata.step_stats.dev_stats:
        for node in dev.node_stats:
            if node.node_name != "RecvTensor":
                op = _OP.match(node.timeline_label)
                if op is not None:
                    ops.append((task_of(dev.device), op.group("type")))
                    if op.group("type").startswith(UPDATES[:2]) or op.group("type") in UPDATES[2:]:
                        writes.append((task_of(dev.device), node.node_name.rpartition("/")[0] or node.node_name))
                continue
            m = _LABEL.search(node.timeline_label)
            if m is None:
                continue
            nbytes = node.output[0].tensor_description.allocation_description.requested_bytes if node.output else 0
            src, dst = task_of(m.group("src")), task_of(m.group("dst"))
            if src != dst:
                transfers.append(Transfer(m.group("tensor"), src, dst, int(nbytes)))
    return StepTraffic(transfers, ops=ops, writes=writes)


class TrafficHook(Hook):
    """Traces steps ``after``..``after + steps`` of a loop; :attr:`traffic` is their mean per step.

    ``fetches`` (optional, a dict of tensors) are fetched on the traced steps
    too, their values kept in :attr:`values` (one dict per traced step): what
    the step did, to set the bytes against (distinct ids in the batch, say).
    """

    def __init__(self, after: int = 20, steps: int = 5, fetches=None):
        self.after, self.steps, self.fetches = after, steps, fetches or {}
        self.seen = 0
        self.transfers, self.ops, self.writes = [], [], []
        self.values = []
        self.traffic = None

    def _tracing(self) -> bool:
        return self.after < self.seen <= self.after + self.steps

    def before_run(self, run_context):
        """Ask for a full trace on the steps it measures."""
        self.seen += 1
        if not self._tracing():
            return None
        import tensorflow as tf
        return RunArgs(fetches=self.fetches,
                       options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE))

    def after_run(self, run_context, run_values):
        """Keep the traced step's transfers; after the last, their mean."""
        if not self._tracing() or run_values.run_metadata is None:
            return
        step = step_traffic(run_values.run_metadata)
        self.transfers += step.transfers
        self.ops += step.ops
        self.writes += [(task, f"{len(self.values)}:{update}") for task, update in step.writes]   # per step
        self.values.append(run_values.results)
        if self.seen == self.after + self.steps:
            self.traffic = StepTraffic(self.transfers, steps=self.steps, ops=self.ops, writes=self.writes)
