"""Graph-mode tf.keras ``fit`` across a cluster: every worker trains the same variables, on the ps.

A compiled tf-keras model (graph mode: TF1 mode, or ``disable_eager_execution``)
trains on a cluster with :func:`fit`, or unchanged with ``model.fit`` in TF1
mode (which routes a trainer's ``fit`` here when TF_CONFIG has ps tasks). Each
fit clones the model's structure into a graph of its own whose variables live
on the ps tasks (placed by bytes; the metrics' running totals stay on each
worker), opens a session on this task's server (the chief initialises or
restores, the others wait for it, bounded), and runs tf-keras's own training
loop, so its progress bars and callbacks work. Each worker reads its own shard
of the data (every n-th example). The chief saves a tf-keras checkpoint
(``model.load_weights`` restores it in one process) every
``save_checkpoint_secs`` and at the end; a restarted chief resumes from it.
After the fit, the model holds the trained weights, so ``evaluate`` and
``predict`` on it run locally as before. Updates are asynchronous, as in
TF 1.x between-graph training; ``sync=True`` makes every step take one gradient
from each worker (:mod:`tfcluster.strategies.sync_replicas`).
"""

import logging
import os
import time

import tensorflow as tf

from ..core.errors import SpecError
from ..graph.placement import ByteBalancedSetter
from ..runtime.preemption import Preempted, SigtermWatch
from ..runtime.server import task_server, wait_for_cluster
from ..runtime.shutdown import serve_as_ps
from ..strategies import STRATEGY_ENV
from ..strategies.sync_replicas import for_keras
from ..topology.cluster import Cluster

tf1 = tf.compat.v1
log = logging.getLogger("tfcluster")

#: The checkpoint dir when none is given: one per model name, under the working dir.
DEFAULT_DIR = "tfcluster-keras"
#: Seconds the chief waits for the other workers' fits before its final checkpoint.
FINISH_TIMEOUT_SECS = 600.0
#: Graphs whose model trains on the cluster through here (their local sessions only evaluate).
_handled_graphs = set()
_original_fit = None        # tf-keras's own Model.fit, kept when TF1 mode routes fit here


def _cloning():
    try:
        from tf_keras.src.models import cloning
        return cloning
    except ImportError:
        raise SpecError("graph-mode tf.keras needs the tf-keras package: pip install 'tfcluster[legacy]'") from None


def _cluster(cluster):
    if cluster is not None:
        return cluster
    return Cluster.from_environment()


def shard(data, index: int, count: int):
    """This worker's part of ``data`` (arrays, lists or dicts of them, a Dataset): every ``count``-th example."""
    if count == 1 or data is None:
        return data
    if isinstance(data, tf.data.Dataset):
        return data.shard(count, index)
    if isinstance(data, dict):
        return {k: shard(v, index, count) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(shard(v, index, count) for v in data)
    return data[index::count]


def fit(model, x=None, y=None, *, cluster=None, checkpoint_dir=None, sync=None, save_checkpoint_secs=60.0,
        startup_timeout=300.0, **fit_kwargs):
    """``model.fit(x, y, ...)`` with every worker of the cluster training the same variables on the ps.

    ``model`` is a compiled tf-keras model, or a function that builds one.
    Without a cluster (no TF_CONFIG) it is a plain ``model.fit``; a ps task
    serves until the trainers are done and returns None. ``sync`` (default:
    ``TFCLUSTER_STRATEGY=sync``, which ``tfcluster local --strategy sync``
    sets) makes each update one gradient from every worker. Returns the History.
    """
    if sync is None:
        sync = os.environ.get(STRATEGY_ENV) in ("sync", "ps-sync")
    model = model() if callable(model) and not hasattr(model, "fit") else model
    cluster = _cluster(cluster)
    if cluster is None:
        return _plain_fit(model, x, y, **fit_kwargs)
    role = cluster.role()
    if role == "ps":
        serve_as_ps(cluster)
        return None
    if role not in ("chief", "worker"):
        raise SpecError(f"tfcluster.keras.fit trains on the chief and the workers, not on {cluster.task}")
    if not cluster.num_tasks("ps"):
        if cluster.num_replicas > 1:
            log.warning("%s trains a private copy of the model: the cluster has no ps tasks to share variables "
                        "through (start it with ps tasks, e.g. tfcluster local --ps 1)", cluster.task)
        return _plain_fit(model, x, y, **fit_kwargs)
    run = _ClusterFit(model, cluster, checkpoint_dir, sync, save_checkpoint_secs, startup_timeout)
    return run.fit(x, y, **fit_kwargs)


def trains_on_cluster(graph) -> bool:
    """True when a model of ``graph`` trains on the cluster through :func:`fit` (its local sessions only evaluate)."""
    return id(graph) in _handled_graphs


def _plain_fit(model, x, y, **kwargs):
    return (_original_fit or type(model).fit)(model, x, y, **kwargs)


def _keep_metrics_local(worker_device):
    """A variable creator: a metric's running totals (ON_READ variables) stay on this worker."""
    def creator(next_creator, **kwargs):
        if kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ:
            with tf1.device(worker_device):
                return next_creator(**kwargs)
        return next_creator(**kwargs)
    return creator


class _ClusterFit:
    """One fit of one task: the cloned graph, its session, the chief's checkpoints."""

    def __init__(self, model, cluster, checkpoint_dir, sync, save_secs, startup_timeout):
        if getattr(model, "optimizer", None) is None:
            raise SpecError("tfcluster.keras.fit needs a compiled model: call model.compile(optimizer, loss) first")
        self.model, self.cluster = model, cluster
        self.name = str(cluster.task)
        self.trainers = cluster.trainers()
        self.index, self.is_chief = self.trainers.index(cluster.task), cluster.is_chief
        self.dir = os.path.abspath(checkpoint_dir or os.path.join(DEFAULT_DIR, model.name))
        self.sync, self.save_secs, self.startup_timeout = sync, save_secs, startup_timeout

    def _build(self):
        worker = self.cluster.task.device
        self.graph = tf1.Graph()
        with self.graph.as_default(), tf1.device(ByteBalancedSetter.for_cluster(self.cluster)), \
                tf1.variable_creator_scope(_keep_metrics_local(worker)):
            self.clone = _cloning().clone_and_build_model(self.model, compile_clone=True)
            self.sync_ops = for_keras(self.clone.optimizer, len(self.trainers), self.index) if self.sync else None
            self.clone._make_train_function()
            # Counts the workers whose fit ended: the chief's last checkpoint waits for all of them.
            self.finished = tf1.Variable(0, name="tfcluster_fits_done", trainable=False)
            self.finish = self.finished.assign_add(1)
            global_vars = tf1.global_variables()
            self.ready = tf1.report_uninitialized_variables(global_vars)
            self.init = tf1.variables_initializer(global_vars)
            self.local_init = tf.group(tf1.local_variables_initializer(), tf1.tables_initializer())
            self.iterations = self.clone.optimizer.iterations

    def _session(self):
        """Chief: initialise, or restore the latest checkpoint; others: wait until the chief has."""
        manager = tf1.train.SessionManager(ready_op=self.ready, graph=self.graph, recovery_wait_secs=0.2,
                                           local_init_op=self.local_init)
        target = task_server(self.cluster).target
        wait_for_cluster(self.cluster, timeout=self.startup_timeout)
        config = self.cluster.session_config()
        if self.is_chief:
            session = manager.prepare_session(target, init_op=self.init, config=config)
            latest = tf.train.latest_checkpoint(self.dir)
            if latest:
                with self.graph.as_default(), session.as_default():
                    self.clone.load_weights(latest)
                log.info("%s restored the model from %s", self.name, latest)
        else:
            log.info("%s waits for the chief to initialise the model", self.name)
            session = manager.wait_for_session(target, config=config, max_wait_secs=self.startup_timeout)
        with self.graph.as_default():
            for v in tf1.global_variables() + tf1.local_variables():
                v._keras_initialized = True     # tf-keras must not initialise (and so reset) them again
        if self.sync_ops is not None:
            self.sync_ops.start(session, chief=self.is_chief)
        return session

    def fit(self, x, y, callbacks=None, **kwargs):
        """Shard the data, fit the clone on the cluster, give the model the trained weights."""
        self._build()
        n = len(self.trainers)
        log.info("%s trains %s on the cluster: variables on %d ps task(s), %s updates, this worker's shard is "
                 "1/%d of the data", self.name, self.model.name, self.cluster.num_tasks("ps"),
                 "sync" if self.sync else "async", n)
        callbacks = list(callbacks or [])
        if self.is_chief:
            os.makedirs(self.dir, exist_ok=True)
            callbacks.append(_chief_checkpoints(self, self.save_secs))
        session = self._session()
        _handled_graphs.add(id(self.model_graph()))   # its local session is no private training
        try:
            with self.graph.as_default(), session.as_default(), SigtermWatch() as sigterm:
                # A SIGTERM ends the epoch after its batch; the chief still saves (preemption.py).
                callbacks.append(_stop_on(sigterm))
                history = _plain_fit(self.clone, shard(x, self.index, n), shard(y, self.index, n),
                                     callbacks=callbacks, **kwargs)
                session.run(self.finish)
                path = None
                if self.is_chief:
                    self._wait_for_the_others(session, 5.0 if sigterm.requested else FINISH_TIMEOUT_SECS)
                    path = self.save()
                weights = self.clone.get_weights()
                steps = int(session.run(self.iterations))
        finally:
            if self.sync_ops is not None:
                self.sync_ops.stop()
            session.close()
        if sigterm.requested:
            line = (f"{self.name} stopped on SIGTERM after update {steps}" + (
                f": saved {os.path.basename(path)} {time.monotonic() - sigterm.at:.1f}s after the signal; a "
                "restarted run resumes from it" if path else " (this task writes no checkpoint)"))
            log.warning("%s", line)
            raise Preempted(line)
        self.model.set_weights(weights)
        self.model.history = history
        log.info("%s done: the model's optimizer has %d update(s) on the ps", self.name, steps)
        return history

    def model_graph(self):
        """The graph the user's model lives in."""
        return self.model.weights[0].graph if self.model.weights else tf1.get_default_graph()

    def _wait_for_the_others(self, session, at_most: float):
        """The chief's final checkpoint holds every worker's updates: wait (bounded) until their fits ended."""
        n, started, said = len(self.trainers), time.monotonic(), 0.0
        while int(session.run(self.finished)) < n:
            waited = time.monotonic() - started
            if waited > at_most:
                log.warning("%s saves without the workers still training after %gs", self.name, at_most)
                return
            if waited - said >= 10:
                said = waited
                log.info("%s waits for %d worker(s) to finish their fit (%.0fs)", self.name,
                         n - int(session.run(self.finished)), waited)
            time.sleep(0.2)

    def save(self, session=None):
        """A tf-keras checkpoint of the clone, named by the shared update count."""
        step = int(tf1.get_default_session().run(self.iterations))
        path = os.path.join(self.dir, f"ckpt-{step}")
        self.clone.save_weights(path)
        log.info("%s saved checkpoint %s", self.name, os.path.basename(path))
        return path


def _chief_checkpoints(run, every_secs):
    """A tf-keras callback: the chief's checkpoints during a cluster fit, every ``every_secs``."""
    import tf_keras

    class ChiefCheckpoints(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._last = time.monotonic()

        def on_train_batch_end(self, batch, logs=None):
            if every_secs and time.monotonic() - self._last >= every_secs:
                run.save()
                self._last = time.monotonic()

    return ChiefCheckpoints()


def _stop_on(sigterm):
    """A tf-keras callback: stop training after the batch in which a SIGTERM came."""
    import tf_keras

    class StopOnSigterm(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if sigterm.requested:
                self.model.stop_training = True

    return StopOnSigterm()


def route_fit_through_cluster():
    """Make tf-keras's graph-mode ``Model.fit`` train on TF_CONFIG's cluster (TF1 mode calls this)."""
    global _original_fit
    from tf_keras.src.engine import training_v1
    if _original_fit is not None:
        return
    _original_fit = training_v1.Model.fit

    def fit_on_cluster(self, x=None, y=None, **kwargs):
        return fit(self, x, y, **kwargs)
    fit_on_cluster.__doc__ = _original_fit.__doc__
    fit_on_cluster.__wrapped__ = _original_fit
    training_v1.Model.fit = fit_on_cluster
