"""Collective all-reduce between graphs: every worker holds a full copy, no ps (the README's table of strategies).

This is what MultiWorkerMirroredStrategy (CollectiveAllReduceStrategy) does,
here in graph mode on TF 2.21. Every worker builds the same graph with its own
copy of the variables on its own CPU. Each step it computes its gradients
(summed over its towers, if it has several devices), all-reduces them with
the other workers through one ``CollectiveReduceV2`` per dtype (the gradients
flattened into one vector), and applies the sum: every loss is already scaled
to the global batch, so the sum is the gradient of the global batch's mean
loss, and every worker applies the same update. Model state that the update
ops change from each worker's own batch (batch-norm moving averages) is
averaged over the workers after each step, as MultiWorkerMirroredStrategy's
MEAN aggregation does.

How the pieces fit in graph mode:

- The collective group leader (the chief, else worker 0) must be in the
  *server's* ConfigProto (``experimental.collective_group_leader``); on TF
  2.21 a session config alone leaves the group unformed and the first
  collective times out. :meth:`configure` sets both.
- Device filters stay at this task alone, as TensorFlow's own collective
  strategy sets them: collectives talk worker-to-worker outside the session
  master, so no session waits for a peer, and a slow or missing worker can
  only stall the collectives, whose waits are bounded (``timeout_secs``, the
  step's own timeout: a per-op one costs a thread per op, see ``_all_reduce``).
- Every worker initialises its own copy, then the weights (and optimizer
  state and global step) are broadcast from worker 0 with
  ``CollectiveBcastSendV2/RecvV2`` at each session start, so all copies start
  identical whether the chief initialised or restored them.
- Worker 0 (the chief) alone writes checkpoints and summaries. There is no
  ps to tell when training ends: every worker reaches the last step together
  and exits. At the end the workers all-gather a checksum of every variable
  and fail loudly if any copy differs (``check_copies``).

With ``wire="bfloat16"`` the float32 gradients are all-reduced in bfloat16,
half the bytes between the workers, and cast back before the update; every
worker receives the same sum, so the copies stay identical. float16 is refused
here: its per-tensor scale (:mod:`tfcluster.graph.wire`) differs from worker to
worker, and a sum of differently scaled values means nothing.

A collective that fails (a peer died, or timed out) aborts the process's
collective executor for good ("Restart your program to reset"), so such a
failure is not retried in-process: it raises :class:`CollectiveError`,
naming the peers that do not answer. Restarting every worker resumes from the
chief's last checkpoint.
"""

import contextlib
import itertools
import logging
from typing import Optional

from ..core.errors import CollectiveError, SpecError
from ..core.tferrors import summary
from ..graph.step import Hook, StepRunner, TrainGraph, global_step_after
from ..graph.wire import WIRE_ENV, resolve_wire
from .base import Strategy, build_single_replica

log = logging.getLogger("tfcluster")

#: Group key of the one collective group (every trainer of the cluster).
GROUP_KEY = 1


def _sendable(v) -> bool:
    """True for a variable whose dtype collective broadcast and the checksum handle."""
    import tensorflow as tf
    return v.dtype.base_dtype in (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)


def _by_dtype(tensors) -> dict:
    """``{dtype: [indices of the tensors of that dtype]}``: one collective per dtype."""
    groups = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype.base_dtype, []).append(i)
    return groups


class CollectiveAllReduceStrategy(Strategy):
    """Between-graph data parallelism with collective all-reduce: each worker holds a full copy, no ps.

    ``towers``: replicas inside each worker (see :class:`~.towers.Towers`;
    None: one replica on the worker's CPU). ``timeout_secs`` bounds every
    training step (its all-reduce); ``startup_timeout_secs`` bounds the first
    one (waiting for the other workers to start). ``check_copies`` compares
    every worker's variables (by checksum) when training ends. ``wire``: the
    type the gradients are all-reduced in (float32 or bfloat16; default
    ``TFCLUSTER_WIRE``, else float32).
    """

    name = "collective"

    def __init__(self, towers=None, timeout_secs: float = 300.0, startup_timeout_secs: float = 300.0,
                 check_copies: bool = True, wire: Optional[str] = None):
        super().__init__(towers)
        self.wire = resolve_wire(wire)
        if self.wire == "float16":
            given = "{wire}='float16'" if wire is not None else f"{WIRE_ENV}=float16"
            raise SpecError(f"{given} does not fit all-reduce: each worker would scale its gradients "
                            "differently; use 'bfloat16'", params=["wire"])
        for what, secs in (("timeout_secs", timeout_secs), ("startup_timeout_secs", startup_timeout_secs)):
            if not secs or secs <= 0:
                raise SpecError(f"{what} must be > 0, got {secs!r}")
        self.timeout_secs = float(timeout_secs)
        self.startup_timeout_secs = float(startup_timeout_secs)
        self.check_copies = check_copies

    # ------------------------------------------------------------- binding
    def bind(self, cluster, idle_ps: bool = False) -> "CollectiveAllReduceStrategy":
        """Check that ``cluster`` has no ps (or, with ``idle_ps``, ps tasks that hold nothing) and that this task
        trains (None: one worker, towers only)."""
        if cluster is not None:
            if cluster.num_tasks("ps") and not idle_ps:
                raise SpecError("the collective strategy uses no ps tasks; start the cluster without them "
                                "(tfcluster local --ps 0 --workers 2)")
            if cluster.task is None or not cluster.task.trains:
                raise SpecError(f"the collective strategy runs on chief and worker tasks, not on {cluster.task}")
        self.cluster = cluster
        if self.towers is not None:
            self.towers.local_devices  # resolve (and check) the devices now
        return self

    @property
    def num_replicas_in_sync(self) -> int:
        """Every replica of every worker."""
        return self.num_workers * self.replicas_per_worker

    @property
    def should_init(self) -> bool:
        """Every worker initialises its own copy; the broadcast then makes them worker 0's."""
        return True

    @property
    def peers(self) -> list:
        """Every trainer of the cluster, chief first (the collective group)."""
        return [] if self.cluster is None else self.cluster.trainers()

    @property
    def leader(self) -> Optional[str]:
        """The collective group leader's device (the chief, else worker 0)."""
        if not self.peers:
            return None
        t = self.peers[0]
        return f"/job:{t.job}/replica:0/task:{t.index}"

    @property
    def host(self) -> str:
        """This worker's CPU: its copy of the variables, its input, its all-reduce."""
        return (self.worker_device or "") + "/device:CPU:0"

    def configure(self, config):
        """Towers' devices, the group leader, and device filters of this task alone (see the module doc)."""
        config = super().configure(config)
        if self.cluster is not None:
            config.experimental.collective_group_leader = self.leader
            del config.device_filters[:]
            config.device_filters.append(self.task.device)
        return config

    def scope(self):
        """This worker's copy of the variables lives on its own CPU."""
        import tensorflow as tf
        return tf.compat.v1.device(self.host)

    def input_scope(self):
        """The input pipeline runs on this worker's CPU."""
        import tensorflow as tf
        return tf.compat.v1.device(self.host)

    def placement_devices(self) -> list:
        """This worker (the report groups devices by task; the towers hold no variables)."""
        return [self.worker_device] if self.worker_device else []

    def describe(self) -> str:
        """e.g. ``collective: 2 workers, all-reduce, 2 tower(s) on ... per worker``."""
        towers = f", {self.towers.describe()} per worker" if self.towers is not None else ""
        wire = f" in {self.wire}" if self.wire != "float32" else ""
        return f"{self.name}: {self.num_workers} worker(s), gradients all-reduced{wire}, no ps{towers}"

    # ------------------------------------------------------------- building
    def build(self, model_fn, next_batch, optimizer, per_replica_batch=None) -> TrainGraph:
        """This worker's replica(s), the all-reduce of their gradients, one update; broadcast and check."""
        import tensorflow as tf
        tf1 = tf.compat.v1
        self.start_graph()
        with self.scope():
            gs, opt, out, mean, grads, update_ops = build_single_replica(self, model_fn, next_batch, optimizer,
                                                                         per_replica_batch)
            # Model state no gradient updates (batch-norm moving averages), before the optimizer adds its own.
            model_state = [v for v in tf1.global_variables()
                           if not v.trainable and v is not gs and v.dtype.base_dtype.is_floating and _sendable(v)]
            grads = self.reduce_gradients(grads)
            with tf.control_dependencies([mean]):
                train = opt.apply_gradients(grads, global_step=gs)
            after = [train] + update_ops
            if self.num_workers > 1 and update_ops and model_state:
                with tf1.name_scope("tfcluster_average_state"):
                    after = [train, self.average_state(model_state, update_ops)]
            runner, hooks = self.finish_graph(global_step_after(after, gs), mean)
        return TrainGraph(runner, gs, mean, hooks=hooks, model=out)

    # ------------------------------------------------ parts other front ends build with (the Estimator's)
    def start_graph(self):
        """Number this graph's collectives from 1: every worker builds the same graph, so the keys match."""
        self._keys = itertools.count(1)

    def reduce_gradients(self, grads) -> list:
        """``(sum over every worker, variable)`` pairs; this worker's own when it is the only one."""
        if self.num_workers < 2:
            return grads
        import tensorflow as tf
        with tf.compat.v1.name_scope("tfcluster_allreduce"):
            return self._all_reduce(grads, wire=self.wire)

    def finish_graph(self, fetch, loss, runner=None):
        """``(runner, hooks)`` of a built graph: a step (``runner``, else one of ``fetch``) that names failed
        collectives, and :class:`_CopiesHook`."""
        import tensorflow as tf
        tf1 = tf.compat.v1
        runner = runner if runner is not None else StepRunner(fetch, loss)
        if self.num_workers < 2:
            return runner, []
        state = [v for v in tf1.global_variables() if _sendable(v)]
        skipped = [v.op.name for v in tf1.global_variables() if not _sendable(v)]
        if skipped:
            log.warning("variables of a type collectives cannot send stay per-worker: %s", ", ".join(skipped))
        with tf1.name_scope("tfcluster_broadcast"):
            broadcast = self._broadcast(state)
        check = None
        if self.check_copies:
            with tf1.name_scope("tfcluster_check_copies"):
                check = self._gather_checksums(state)
        return _Guarded(self, runner), [_CopiesHook(self, broadcast, check, [v.op.name for v in state])]

    def _collective_args(self, timeout):
        import tensorflow as tf
        return dict(group_size=tf.constant(self.num_workers), group_key=tf.constant(GROUP_KEY),
                    instance_key=tf.constant(next(self._keys)), communication_hint="auto",
                    timeout_seconds=float(timeout))

    def _all_reduce(self, grads, wire="float32"):
        """Sum every worker's gradients: one CollectiveReduceV2 per dtype over the flattened gradients."""
        import tensorflow as tf
        dense = [tf.convert_to_tensor(g) for g, _ in grads]  # IndexedSlices travel dense
        out = [None] * len(dense)
        for dtype, idx in _by_dtype(dense).items():
            flat = tf.concat([tf.reshape(dense[i], [-1]) for i in idx], 0)
            narrow = wire == "bfloat16" and dtype == tf.float32
            if narrow:
                flat = tf.cast(flat, tf.bfloat16)
            # No per-op timeout: TF starts a thread that sleeps the whole timeout at every such op
            # (tensorflow/tensorflow#62466), thousands a second at fast steps, until the process can start no
            # thread ("Resource temporarily unavailable"). The step's own timeout bounds it (_Guarded.attach).
            total = tf.raw_ops.CollectiveReduceV2(input=flat, ordering_token=[], merge_op="Add", final_op="Id",
                                                  **self._collective_args(0.0))
            if narrow:
                total = tf.cast(total, tf.float32)
            parts = tf.split(total, [dense[i].shape.num_elements() for i in idx])
            for i, part in zip(idx, parts):
                out[i] = tf.reshape(part, tf.shape(dense[i]))
        return [(g, v) for g, (_, v) in zip(out, grads)]

    def average_state(self, variables, after):
        """Set each variable to its mean over the workers, once ``after`` (the update ops) ran.

        Each worker updates such state from its own batch; averaging the
        values is averaging the updates, as MultiWorkerMirroredStrategy's MEAN
        aggregation does, and keeps the copies identical.
        """
        import tensorflow as tf
        with tf.control_dependencies(list(after)):
            values = [v.read_value() for v in variables]
        summed = self._all_reduce([(x, v) for x, v in zip(values, variables)])
        return tf.group(*[v.assign(total / float(self.num_workers), read_value=False) for total, v in summed])

    def _broadcast(self, variables):
        """Worker 0 sends every variable, the others receive and assign: one broadcast per dtype."""
        import tensorflow as tf
        assigns = []
        for dtype, idx in _by_dtype(variables).items():
            args = self._collective_args(self.startup_timeout_secs)
            sizes = [variables[i].shape.num_elements() for i in idx]
            if self.worker_index == 0:
                flat = tf.concat([tf.reshape(variables[i].read_value(), [-1]) for i in idx], 0)
                assigns.append(tf.raw_ops.CollectiveBcastSendV2(input=flat, **args).op)
                continue
            flat = tf.raw_ops.CollectiveBcastRecvV2(shape=tf.constant([sum(sizes)]), T=dtype, **args)
            for i, part in zip(idx, tf.split(flat, sizes)):
                v = variables[i]
                assigns.append(v.assign(tf.reshape(part, v.shape), read_value=False))
        return tf.group(*assigns, name="broadcast_from_worker_0")

    def _gather_checksums(self, variables):
        """Every worker's checksum of every variable: ``[workers x variables]`` int64, exact (bit patterns)."""
        import tensorflow as tf
        sums = []
        for v in variables:
            value = tf.reshape(v.read_value(), [-1])
            width = {2: tf.uint16, 4: tf.uint32, 8: tf.uint32}[v.dtype.base_dtype.size]
            bits = tf.reshape(tf.bitcast(value, width), [-1])
            words = tf.cast(bits, tf.int64)
            # Weighting by position catches two swapped elements, which a plain sum would miss.
            weights = tf.cast(tf.range(tf.size(words)) % 8191 + 1, tf.int64)
            sums.append(tf.reduce_sum(words * weights))
        mine = tf.stack(sums)
        gathered = tf.raw_ops.CollectiveGatherV2(input=mine, ordering_token=[],
                                                 **self._collective_args(self.timeout_secs))
        return tf.reshape(gathered, [self.num_workers, len(variables)])

    # ------------------------------------------------------------- failures
    def failure(self, error, what: str, waited_for: float) -> CollectiveError:
        """A CollectiveError for ``error`` during ``what``, naming the peers that do not answer."""
        from ..runtime.server import TaskState, probe
        me = self.task
        others = [t for t in self.peers if t != me]
        states = probe(self.cluster, others, timeout=1.0) if others else {}
        down = [f"{t} at {self.cluster.address(t)}" for t, s in states.items() if s is not TaskState.UP]
        # TF's own words ("Collective has timed out waiting for other workers."), not its traceback lines.
        first = summary(error, prefer="Collective")
        if down:
            who = f"{', '.join(down)} {'does' if len(down) == 1 else 'do'} not answer"
        else:
            who = f"every worker answers, so one is stuck or slower than the {waited_for:g}s timeout"
        return CollectiveError(
            f"{me}: the all-reduce group failed during {what} ({type(error).__name__}: {first.strip()}); {who}. "
            "Collectives cannot resume in a running process: restart every worker (they resume from the "
            "chief's last checkpoint)")


@contextlib.contextmanager
def mean_gradients(optimizer, collective):
    """While tf-keras makes a train function: ``optimizer``'s gradients are the mean over every worker's.

    A tf-keras optimizer computes them in ``get_gradients``; a wrapped
    ``tf.compat.v1.train`` optimizer (tf-keras's ``TFOptimizer``) in its own
    ``compute_gradients``. Either is replaced for the duration, then put back.
    """
    n = float(collective.num_workers)

    def mean(pairs):
        present = [(g, v) for g, v in pairs if g is not None]
        summed = iter(collective.reduce_gradients(present))
        return [(None, v) if g is None else (next(summed)[0] / n, v) for g, v in pairs]

    inner = getattr(optimizer, "optimizer", None)     # TFOptimizer's tf.compat.v1.train optimizer
    if inner is not None and hasattr(inner, "compute_gradients"):
        owner, name = inner, "compute_gradients"
        original = inner.compute_gradients

        def replaced(loss, var_list=None, *args, **kwargs):
            return mean(original(loss, var_list, *args, **kwargs))
    elif hasattr(optimizer, "get_gradients"):
        owner, name = optimizer, "get_gradients"
        original = optimizer.get_gradients

        def replaced(loss, params):
            return [g for g, _ in mean(list(zip(original(loss, params), params)))]
    else:
        raise SpecError(f"all-reduce across workers needs a tf-keras or tf.compat.v1.train optimizer, not "
                        f"{type(optimizer).__name__}")
    setattr(owner, name, replaced)
    try:
        yield
    finally:
        delattr(owner, name)       # the instance attribute goes: the class's method is back


def _is_collective_failure(e) -> bool:
    import tensorflow as tf
    if isinstance(e, (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.AbortedError,
                      tf.errors.CancelledError)):
        return True
    return isinstance(e, tf.errors.OpError) and "ollective" in str(e)


class _Guarded:
    """A step runner whose collective failures become one clear CollectiveError (never retried)."""

    def __init__(self, strategy, runner):
        self.strategy, self.runner = strategy, runner
        self.train_fetch, self.loss, self.on_stall = runner.train_fetch, runner.loss, runner.on_stall
        self.steps_done = 0

    @property
    def step_options(self):
        """The wrapped runner's RunOptions (the step timeout)."""
        return self.runner.step_options

    def attach(self, session, step_timeout_secs=None):
        """Bind the wrapped runner to ``session``, each step bounded by ``timeout_secs`` if nothing bounds it."""
        self.runner.attach(session, step_timeout_secs or self.strategy.timeout_secs)

    def step(self, request=None):
        """One step; a failed or timed-out all-reduce raises CollectiveError."""
        try:
            result = self.runner.step(request)
        except Exception as e:
            if not _is_collective_failure(e):
                raise
            raise self.strategy.failure(e, f"training step {self.steps_done + 1} of this worker",
                                        self.strategy.timeout_secs) from None
        self.steps_done += 1
        return result


class _CopiesHook(Hook):
    """Broadcast worker 0's variables at each session start; compare every copy's checksums at the end."""

    def __init__(self, strategy, broadcast, check, names):
        self.s, self.broadcast, self.check, self.names = strategy, broadcast, check, names

    def after_create_session(self, session, coord):
        """Wait (bounded) for every worker to join, then take worker 0's variables."""
        s = self.s
        log.info("%s joins the all-reduce group of %d workers (leader %s; waits up to %gs for them)", s.task,
                 s.num_workers, s.leader, s.startup_timeout_secs)
        try:
            session.run(self.broadcast)
        except Exception as e:
            if not _is_collective_failure(e):
                raise
            raise s.failure(e, "the start (broadcast of worker 0's variables)", s.startup_timeout_secs) from None
        if s.worker_index == 0:
            log.info("%s sent its %d variables to the other %d worker(s)", s.task, len(self.names), s.num_workers - 1)
        else:
            log.info("%s holds worker 0's variables (%d received)", s.task, len(self.names))

    def end(self, session):
        """Fail loudly if the workers' copies are not identical."""
        if self.check is None:
            return
        s = self.s
        try:
            table = session.run(self.check)
        except Exception as e:
            if not _is_collective_failure(e):
                raise
            raise s.failure(e, "the final comparison of the copies", s.timeout_secs) from None
        differ = [n for j, n in enumerate(self.names) if len(set(int(x) for x in table[:, j])) > 1]
        if differ:
            raise CollectiveError(f"{s.task}: the workers' copies differ after training in {len(differ)} "
                                  f"variable(s): {', '.join(differ[:5])}")
        log.info("%s: all %d workers hold identical variables (%d compared by checksum)", s.task, s.num_workers,
                 len(self.names))
