"""Synchronous parameter-server steps: every gradient counted once per distinct worker, every wait bounded.

One update per global step, from the gradients of at least
``replicas_to_aggregate`` (R) *distinct* workers. TensorFlow's
SyncReplicasOptimizer counts gradients, so one fast worker can fill a step with
its own repeated gradients while the others are still starting (docs/pitfalls.md,
item 5); here each worker has its own gradient slot on the ps, next to the
variable, stamped with the step it belongs to. A repeated push overwrites that
worker's slot; it can never count twice. The chief waits until R slots carry
the current step, adds them (scaled by R/k when k > R arrived, so backups never
change the update's size), applies once, and wakes the workers through one
queue each. Workers beyond R are backups: a step does not wait for the slowest.

This module builds that graph (:class:`SyncGraph`); :mod:`.sync_run` runs it,
with every wait bounded: a wait that lasts ``stall_warn_secs`` logs which
workers have not contributed, and after ``stall_timeout_secs`` it raises
:class:`~tfcluster.core.errors.SyncStallError` naming them (a worker died and
no backup covers it). Pushes are idempotent and waits re-check state on the
ps, so a wait that timed out is simply resumed. Two front ends use it: ``fit``'s
``sync`` strategy (a step is one run) and TF 1.x's ``SyncReplicasOptimizer``
(:mod:`.sync_replicas`: the push is the script's train op, the wait follows
it). The slots cost one extra copy of the model per worker on the ps, the price
of exactness; they are not checkpointed.
"""

from ..graph.placement import SYNC_STATE_COLLECTION
from ..graph.step import init_if_needed


def gradient_slots(make, g, v, trainers: int) -> list:
    """Each worker's slot for the gradient ``g`` of ``v``: a tensor of its shape, or a table's (rows, indices).

    A table's gradient (IndexedSlices) stays sparse: the slot holds the rows
    this worker touched and their indices, of any number, so a step sends and
    keeps only those rows, never a dense table-sized tensor (graph/sparse.py).
    ``make(name, initial, colocate=, shape=)`` makes one state variable.
    """
    import tensorflow as tf
    shape, dtype = v.shape, v.dtype.base_dtype
    if not isinstance(g, tf.IndexedSlices):
        return [make(f"{v.op.name}/grad_{i}", lambda: tf.zeros(shape, dtype), colocate=v) for i in range(trainers)]
    rows = tf.TensorShape([None]).concatenate(shape[1:])
    return [(make(f"{v.op.name}/grad_{i}/values", lambda: tf.zeros([0] + shape[1:].as_list(), dtype), colocate=v,
                  shape=rows),
             make(f"{v.op.name}/grad_{i}/indices", lambda: tf.zeros([0], g.indices.dtype), colocate=v,
                  shape=tf.TensorShape([None])))
            for i in range(trainers)]


def arrived_rows(hits, arrived, slots, dense_shape, dtype, to_aggregate: int, average: bool):
    """The rows of a table's slots whose worker pushed for this step, one after another, scaled as
    :meth:`SyncGraph._aggregated` scales a dense sum (the optimizer adds up equal indices on the ps)."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    everyone = to_aggregate == len(slots)
    values, indices = [], []
    for h, (v, i) in zip(hits, slots):
        if everyone:
            values.append(v.read_value())
            indices.append(i.read_value())
            continue
        # A worker that did not push for this step adds no rows (zeros would still move Adam's slots).
        values.append(tf1.cond(h, v.read_value, lambda v=v: v.read_value()[:0]))
        indices.append(tf1.cond(h, i.read_value, lambda i=i: i.read_value()[:0]))
    total = tf.concat(values, 0)
    if average:
        total = total / float(len(slots)) if everyone else total / tf.cast(arrived, dtype)
    elif not everyone:
        total = total * (tf.cast(to_aggregate, dtype) / tf.cast(arrived, dtype))
    return tf.IndexedSlices(total, tf.concat(indices, 0), dense_shape)


def _worker_local(tf1, name, initial):
    """One of a worker's own sync variables (a local variable: never saved, initialised on each session)."""
    return tf1.Variable(initial, trainable=False, use_resource=True, name=name,
                        collections=[tf1.GraphKeys.LOCAL_VARIABLES])


class SyncGraph:
    """The graph of a sync step: slots, stamps and queues on the ps, and the ops each role runs.

    - ``trainers``: every trainer's name (for the stall lines), chief first;
      ``index``: this worker's place among them; ``to_aggregate``: R.
    - ``global_step``: its device holds the coordination state, so every wait
      loop runs on one device; ``worker_device``: where this worker's own ops go.
    - ``grads_and_vars``: this worker's gradients; ``apply(aggregated)``: the
      real update of the aggregated ``(grad, var)`` pairs, which must increase
      the global step.
    - ``loss`` (optional): reported for a step whose wait timed out.
    - ``average``: the update is the mean of the gradients that arrived, as
      TF 1.x's SyncReplicasOptimizer takes it from its accumulators (each
      worker's loss is its own batch's mean); else their sum, scaled to R
      gradients (``fit``'s losses are already scaled to the global batch).
    """

    def __init__(self, trainers, index: int, to_aggregate: int, global_step, grads_and_vars, apply,
                 worker_device: str, loss=None, update_ops=(), average: bool = False):
        import tensorflow as tf
        self.tf, self.tf1 = tf, tf.compat.v1
        self.trainers = [str(t) for t in trainers]
        self.num_trainers = len(self.trainers)
        self.index, self.to_aggregate = index, to_aggregate
        self.is_chief = index == 0
        self.gs, self.grads, self.apply_fn, self.update_ops = global_step, list(grads_and_vars), apply, list(update_ops)
        self.coord = global_step.device
        self.worker = worker_device
        self.loss = loss if loss is not None else tf.constant(float("nan"))
        self.average = average
        self.state = []          # (variable, initial-value function)
        self._build_state()

    # ---------------------------------------------------------------- state
    def _state_var(self, name, initial, device=None, colocate=None, shape=None):
        tf1 = self.tf1
        # The graph's own colocate_with is tf1.colocate_with without its deprecation warning, printed by
        # every worker (same placement: it is what tf1.colocate_with calls in graph mode).
        ctx = tf1.get_default_graph().colocate_with(colocate) if colocate is not None else tf1.device(device)
        with ctx:
            v = tf1.Variable(initial(), trainable=False, use_resource=True, name=name, shape=shape,
                             collections=[SYNC_STATE_COLLECTION])
        self.state.append((v, initial))
        return v

    def read_global_step(self):
        """The global step as int64 (what stamps and wake-ups carry)."""
        return self.tf.cast(self.gs.read_value(), self.tf.int64)

    def _build_state(self):
        tf, tf1 = self.tf, self.tf1
        with tf1.name_scope("tfcluster_sync"):
            with tf1.device(self.coord):
                self.stamps = [self._state_var(f"stamp_{i}", lambda: tf.constant(-1, tf.int64), device=self.coord)
                               for i in range(self.num_trainers)]
                self.arrivals = tf1.FIFOQueue(max(64, 8 * self.num_trainers), [tf.int32], shapes=[[]],
                                              shared_name="tfcluster_sync_arrivals", name="arrivals")
                self.wakeups = [tf1.FIFOQueue(2, [tf.int64], shapes=[[]], shared_name=f"tfcluster_sync_wakeup_{i}",
                                              name=f"wakeup_{i}") for i in range(self.num_trainers)]
            self.slots = [gradient_slots(self._state_var, g, v, self.num_trainers) for g, v in self.grads]
            with tf1.device(self.worker):
                # The local step is initialised to 0, then to the global step by local_step_init (after the
                # model is ready: a local init that read the ps would fail on a worker whose chief has not
                # initialised it yet). The loss of a step whose wait timed out is still reported, from
                # last_loss. A run that pushed (pushes moved) is followed by the step's wait.
                self.local_variables = [_worker_local(tf1, name, tf.constant(value, dtype)) for name, value, dtype in
                                        (("local_step", 0, tf.int64), ("last_loss", float("nan"), tf.float32),
                                         ("pushes", 0, tf.int64))]
                self.local_step, self.last_loss, self.pushes = self.local_variables
                # After its own initialiser: a session's local init runs both in one run, in no set order, and
                # a restarted chief whose step was set, then zeroed, waited for gradients of step 0 for ever.
                # Only the assignment waits for it: a read on the ps that waited for this worker would make the
                # ps dial it, and a worker created again at a new address is dialled at its old one for 30 s.
                global_step = self.read_global_step()
                with tf.control_dependencies([self.local_step.initializer]):
                    set_step = self.local_step.assign(global_step, read_value=False)
                # TF 1.x's local_step_init_op readied the one local variable its optimizer made, and programs
                # pass it (or chief_init_op) as their whole local init: a Supervisor's ready check covers local
                # variables, so this op readies every one the sync step makes (tests/test_tf1_sync.py).
                others = [v.initializer for v in self.local_variables if v is not self.local_step]
                self.local_step_init = tf.group(set_step, *others, name="local_step_init")
                self.last_loss_value = self.last_loss.read_value()
                self.pushes_value = self.pushes.read_value()

    @property
    def state_variables(self) -> list:
        """The shared state a sync step needs initialised before anyone trains (not checkpointed)."""
        return [v for v, _ in self.state]

    # ---------------------------------------------------------------- pieces
    def push(self, deps=()):
        """Write this worker's gradients into its slots, then stamp them with its step: ``(stamped, step)``."""
        tf, tf1 = self.tf, self.tf1
        with tf1.device(self.worker), tf.control_dependencies(list(deps) + self.update_ops):
            step = self.local_step.read_value()
            writes = [self.last_loss.assign(self.loss, read_value=False)]
        for (g, v), slots in zip(self.grads, self.slots):
            with tf1.get_default_graph().colocate_with(v):
                if isinstance(g, tf.IndexedSlices):
                    values, indices = slots[self.index]
                    writes += [values.assign(g.values, read_value=False), indices.assign(g.indices, read_value=False)]
                else:
                    writes.append(slots[self.index].assign(g, read_value=False))
        with tf1.device(self.coord), tf.control_dependencies(writes):
            stamped = self.stamps[self.index].assign(step, read_value=False)
        with tf1.device(self.worker), tf.control_dependencies([stamped]):
            counted = self.pushes.assign_add(1, read_value=False)
        return tf.group(stamped, counted), step

    def arrive(self, deps):
        """A worker's push tells the chief it arrived (the chief's wait wakes on it)."""
        with self.tf1.device(self.coord), self.tf.control_dependencies(list(deps)):
            return self.arrivals.enqueue(self.index)

    def _count(self, step):
        tf = self.tf
        return tf.add_n([tf.cast(tf.equal(s.read_value(), step), tf.int32) for s in self.stamps])

    def _on_the_ps(self, step):
        """``step`` (read on this worker) copied once to the ps, for a wait loop to compare with.

        TF 2.21's while_loop passes each captured tensor through every iteration: the worker's step, captured
        as it was, cost each iteration a round trip to the worker, 3-5 ms of a 15 ms sync step of the bench
        MLP (scripts/bench/profile_step.py). Copied to the ps first, the loop runs on the ps alone.
        """
        with self.tf1.device(self.coord):
            return self.tf.identity(step)

    def wait_for_gradients(self, step=None, deps=()):
        """On the chief: block until R distinct workers' slots carry ``step`` (default: the local step)."""
        tf, tf1 = self.tf, self.tf1
        if step is None:
            with tf1.device(self.worker):
                step = self.local_step.read_value()
        with tf1.device(self.coord), tf.control_dependencies(list(deps)):
            step = self._on_the_ps(step)

            def body(i):
                with tf.control_dependencies([self.arrivals.dequeue()]):
                    return i + 1
            loops = tf1.while_loop(lambda i: self._count(step) < self.to_aggregate, body, [tf.constant(0)],
                                   back_prop=False, parallel_iterations=1)
            with tf.control_dependencies([loops]):
                return self._count(step)

    def wait_for_update(self, step=None, deps=()):
        """On a worker: block until the chief applied ``step`` (or reset this worker's stamp); the new step."""
        tf, tf1 = self.tf, self.tf1
        mine = self.stamps[self.index]
        if step is None:
            with tf1.device(self.worker):
                step = self.local_step.read_value()
        with tf1.device(self.coord), tf.control_dependencies(list(deps)):
            step = self._on_the_ps(step)

            def cond(i):
                return tf.logical_and(tf.equal(self.read_global_step(), step), tf.equal(mine.read_value(), step))

            def body(i):
                with tf.control_dependencies([self.wakeups[self.index].dequeue()]):
                    return i + 1
            loops = tf1.while_loop(cond, body, [tf.constant(0)], back_prop=False, parallel_iterations=1)
            with tf.control_dependencies([loops]):
                new = self.read_global_step()
        with tf1.device(self.worker):
            with tf.control_dependencies([self.local_step.assign(new, read_value=False)]):
                return tf.identity(new)

    def _wake(self, i, value):
        """Put one wake-up in worker i's queue unless one is already there (the chief is its only producer)."""
        tf, tf1 = self.tf, self.tf1
        q = self.wakeups[i]

        def put():
            with tf.control_dependencies([q.enqueue(value)]):
                return tf.constant(True)
        return tf1.cond(tf.equal(q.size(), 0), put, lambda: tf.constant(False))

    def apply(self, deps=()):
        """On the chief: add the slots stamped with the current step, apply once, wake everyone; the new step."""
        with self.tf.control_dependencies(list(deps)):
            return self._apply_after()

    def _aggregated(self, hits, arrived):
        tf, tf1 = self.tf, self.tf1
        out = []
        for (g, v), slots in zip(self.grads, self.slots):
            dtype = v.dtype.base_dtype
            with tf1.get_default_graph().colocate_with(v):
                if isinstance(g, tf.IndexedSlices):
                    shape = g.dense_shape if g.dense_shape is not None else tf.constant(v.shape.as_list())
                    out.append((arrived_rows(hits, arrived, slots, shape, dtype, self.to_aggregate, self.average), v))
                    continue
                if self.to_aggregate == self.num_trainers:
                    # No backups: the check holds only when every slot carries this step, so the masks
                    # are all 1; two passes over each gradient saved.
                    total = tf.add_n([slot.read_value() for slot in slots])
                    out.append((total / float(self.num_trainers) if self.average else total, v))
                    continue
                total = tf.add_n([tf.cast(h, dtype) * slot.read_value() for h, slot in zip(hits, slots)])
                scale = (1.0 if self.average else tf.cast(self.to_aggregate, dtype)) / tf.cast(arrived, dtype)
                out.append((total * scale, v))
        return out

    def _apply_after(self):
        tf, tf1 = self.tf, self.tf1
        with tf1.device(self.worker):
            step = self.local_step.read_value()
        with tf1.device(self.coord):
            hits = [tf.equal(s.read_value(), step) for s in self.stamps]
            arrived = tf.add_n([tf.cast(h, tf.int32) for h in hits])
            # Never apply a step that fewer than R distinct workers filled.
            check = tf1.debugging.assert_greater_equal(arrived, self.to_aggregate, message="sync step under-filled")
        with tf.control_dependencies([check]):
            update = self.apply_fn(self._aggregated(hits, arrived))
        with tf1.device(self.coord):
            with tf.control_dependencies([update]):
                drained = self.arrivals.dequeue_many(self.arrivals.size())
            with tf.control_dependencies([drained]):
                new = self.read_global_step()
                wakes = [self._wake(i, new) for i in range(self.num_trainers) if i != self.index]
        with tf1.device(self.worker), tf.control_dependencies(wakes):
            with tf.control_dependencies([self.local_step.assign(new, read_value=False)]):
                return tf.identity(new)

    def reset_and_wake(self):
        """Part of the chief's local init, on every session it creates: forget stamped pushes, wake every worker.

        A chief that initialised or restored the model may hold weights other
        than those pending pushes were computed with (a restart rolls the
        global step back). A worker whose stamp is cleared leaves its wait and
        pushes again for the step the chief now holds. Non-chief workers only
        become ready after this ran, so a fresh run loses no push.
        """
        tf, tf1 = self.tf, self.tf1
        with tf1.device(self.coord):
            resets = [s.assign(-1, read_value=False) for s in self.stamps]
            with tf.control_dependencies(resets):
                new = self.read_global_step()
                wakes = [self._wake(i, new) for i in range(self.num_trainers) if i != self.index]
            with tf.control_dependencies(resets + wakes):  # a lone worker has nobody to wake
                return tf.no_op(name="reset_and_wake")

    def chief_init_ops(self) -> list:
        """The chief's local init: the slots initialised where a ps lost them, then every stamp reset."""
        slots = [(v, init) for v, init in self.state if not any(v is s for s in self.stamps)]
        with self.tf.control_dependencies([self.local_step_init]):
            return [init_if_needed(v, init) for v, init in slots] + [self.reset_and_wake()]

