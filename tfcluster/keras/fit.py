"""A compiled tf-keras model's ``fit`` on a cluster: tf-keras's own loop over tfcluster's session, loop and hooks.

Each trainer fits its shard of the data (every n-th example) into the
model's clone (:mod:`.graph`), whose variables are on the ps. tf-keras's loop
runs as usual (progress bars, callbacks, validation, History), but each batch
is a step of tfcluster's :class:`~tfcluster.training.loop.TrainingLoop` on a
:class:`~tfcluster.training.session.TrainingSession`, the same as ``fit``'s
and the Estimator's: the chief joins the live model, restores the newest
readable checkpoint or initialises; the others wait for it, polling every
0.2 s; a lost task is recovered, bounded; a silent ps is named after the step
timeout; a worker whose chief is gone for good stops in one line (the chief's
heartbeat); a SIGTERM ends the batch, the chief saves and the program exits
143. The chief's checkpoints are hooks, as everywhere
(:mod:`tfcluster.training.hooks`), in tf-keras's format (:mod:`.checkpoints`).
At the end every trainer waits, bounded, until every trainer's fit ended,
so the chief's final checkpoint holds every worker's updates. After the fit the
user's model holds the trained weights and the optimizer's state (its
``iterations`` counts every worker's updates), the same on every trainer, so
``evaluate``, ``predict`` and a learning-rate schedule read what the cluster
trained.
"""

import dataclasses
import logging
import os

import tensorflow as tf

from .. import strategies
from ..core import patches
from ..core.errors import SpecError
from ..core.logs import quiet_keras_thread_notice
from ..runtime.shutdown import done_when_finished
from ..topology.cluster import Cluster, Role
from ..topology.taskenv import new_run_id, run_id
from ..training.assembly import RunAssembly, part_of
from ..training.loop import TrainingLoop
from ..training.train import FitConfig
from .checkpoints import KerasSaver
from .collective import even, strategy_for, worker_batch
from .graph import DATASET, build, prepare_for
from .session import CurrentSession
from .step import SharedTrainFunction

tf1 = tf.compat.v1
log = logging.getLogger("tfcluster")

#: The checkpoint dir when none is given: ``tfcluster-keras/<run>/<model name>`` under the working dir.
DEFAULT_DIR = "tfcluster-keras"
#: Graphs whose model trains on the cluster through here (their local sessions only evaluate).
_handled_graphs = set()


def shard(data, index: int, count: int):
    """This worker's part of ``data`` (arrays, lists or dicts of them, a Dataset): every ``count``-th example."""
    if count == 1 or data is None:
        return data
    if isinstance(data, DATASET):
        return data.shard(count, index)
    if isinstance(data, dict):
        return {k: shard(v, index, count) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(shard(v, index, count) for v in data)
    return data[index::count]


def fit(model, x=None, y=None, *, cluster=None, checkpoint_dir=None, sync=None, config=None, **kwargs):
    """``model.fit(x, y, ...)`` with every trainer of the cluster training the same variables on the ps.

    ``model`` is a compiled tf-keras model, or a function that builds one.
    Without a cluster (no TF_CONFIG) it is a plain ``model.fit``; a ps task
    serves until the trainers are done and returns None. ``sync`` (default:
    ``TFCLUSTER_STRATEGY=sync``, which ``tfcluster local --strategy sync``
    sets) makes each update one gradient from every worker. ``checkpoint_dir``
    (default: ``tfcluster-keras/<run>/<model name>``) is where the chief
    saves. ``config`` (a :class:`~tfcluster.FitConfig`) and the keywords named
    like its fields (``save_checkpoint_secs``, ``keep_checkpoints``,
    ``startup_timeout``, ``step_timeout_secs``, ``chief_timeout_secs``,
    ``max_recoveries``) set the session's options; every other keyword goes to
    tf-keras's ``fit``. Returns the History.
    """
    quiet_keras_thread_notice()
    options = {k: kwargs.pop(k) for k in [f.name for f in dataclasses.fields(FitConfig)] if k in kwargs}
    config = (config or FitConfig()).replace(**options)
    model = model() if callable(model) and not hasattr(model, "fit") else model
    cluster = cluster if cluster is not None else Cluster.from_environment()
    if cluster is None:
        return _plain_fit(model, x, y, **kwargs)
    if sync is None:        # TFCLUSTER_STRATEGY (tfcluster local --strategy), as fit reads it
        sync = strategies.canonical(strategies.default_name(cluster)) == "sync"
    role = part_of(cluster, "tfcluster.keras.fit")
    if role is Role.PS:
        return None
    if role is Role.EVALUATOR:
        raise SpecError(f"tfcluster.keras.fit trains on the chief and the workers, not on {cluster.task}: "
                        "evaluate the chief's checkpoints with model.evaluate in a program of its own")
    collective = strategy_for(model, cluster)
    if collective is not None:
        with done_when_finished(cluster, last=False):
            return ClusterFit(model, cluster, checkpoint_dir, False, config, collective).fit(x, y, **kwargs)
    if not cluster.num_tasks("ps"):
        if cluster.num_replicas > 1:
            log.warning("%s trains a private copy of the model: the cluster has no ps tasks to share variables "
                        "through (start it with ps tasks, e.g. tfcluster local --ps 1)", cluster.task)
        return _plain_fit(model, x, y, **kwargs)
    if getattr(model, "optimizer", None) is None:
        raise SpecError("tfcluster.keras.fit needs a compiled model: call model.compile(optimizer, loss) first")
    with done_when_finished(cluster, last=False):
        return ClusterFit(model, cluster, checkpoint_dir, sync, config).fit(x, y, **kwargs)


def trains_on_cluster(graph) -> bool:
    """True when a model of ``graph`` trains on the cluster through :func:`fit` (its local sessions only evaluate)."""
    return id(graph) in _handled_graphs


def _plain_fit(model, x, y, **kwargs):
    if patches.installed("keras.fit_on_cluster"):
        return patches.original("keras.fit_on_cluster")(model, x, y, **kwargs)
    return type(model).fit(model, x, y, **kwargs)


def default_checkpoint_dir(model_name: str) -> str:
    """``tfcluster-keras/<run>/<model name>``: a restarted chief of the run resumes it, another run starts afresh.

    The run is :func:`~tfcluster.topology.taskenv.run_id` (``tfcluster local``'s,
    or Slurm's job); without one, this process's own, so two runs of a program
    never share checkpoints because their models have tf-keras's default name.
    """
    return os.path.join(DEFAULT_DIR, run_id() or new_run_id(), model_name)


class ClusterFit:
    """One fit of one trainer: the clone's graph, its training session and hooks, tf-keras's loop over them."""

    def __init__(self, model, cluster, checkpoint_dir, sync: bool, config: FitConfig, collective=None):
        self.model, self.cluster, self.sync, self.config = model, cluster, sync, config
        self.collective = collective        # all-reduce across the workers (.collective), else the ps
        self.name = str(cluster.task)
        self.trainers = cluster.trainers()
        self.index, self.is_chief = self.trainers.index(cluster.task), cluster.is_chief
        # The chief's dir; a worker knows it too when it is given or the run's (for its chief-lost line).
        known = checkpoint_dir or (default_checkpoint_dir(model.name) if self.is_chief or run_id() else None)
        self.dir = os.path.abspath(known) if known else None

    def fit(self, x, y, callbacks=None, **kwargs):
        """Shard the data, fit the clone on the cluster, give the model what it trained."""
        n = len(self.trainers)
        given = (x, y, kwargs.get("sample_weight"), kwargs.get("class_weight"))
        if self.collective is not None:     # equal shards, and the global batch split (.collective)
            x, y = even(x, n), even(y, n)
            kwargs["sample_weight"] = even(kwargs.get("sample_weight"), n)
            kwargs["batch_size"] = worker_batch(kwargs.get("batch_size"), n, x)
        x, y = shard(x, self.index, n), shard(y, self.index, n)
        if kwargs.get("sample_weight") is not None:
            kwargs["sample_weight"] = shard(kwargs["sample_weight"], self.index, n)
        built = build(self.model, self.cluster, self.sync, x, y, kwargs.get("sample_weight"),
                      kwargs.get("class_weight"), collective=self.collective)
        how = f"variables on {self.cluster.num_tasks('ps')} ps task(s), {'sync' if self.sync else 'async'} updates" \
            if self.collective is None else f"a copy on each of the {n} workers, gradients all-reduced"
        log.info("%s trains %s on the cluster: %s, this worker's shard is 1/%d of the data", self.name,
                 self.model.name, how, n)
        with built.graph.as_default():
            session, checkpoints = self._session(built)
            try:
                with CurrentSession(session).as_default():
                    history, state = self._run(built, session, checkpoints, built.x, y, callbacks, kwargs)
            finally:
                session.close()
        if not self.model.built:      # built by the data, as its clone was
            with tf1.get_default_graph().as_default():
                prepare_for(self.model, *given)
        _give(self.model, *state)
        self.model.history = history
        log.info("%s done: the model's optimizer has %d update(s) %s", self.name, state[-1],
                 "on the ps" if self.collective is None else "from every worker's gradients")
        return history

    def _session(self, built):
        """The training session of the clone's graph, with its hooks, finalized (but open: tf-keras adds ops)."""
        c = self.config
        # With all-reduce every worker initialises its own copy (then takes worker 0's); only the chief saves.
        run = RunAssembly(self.cluster, checkpoint_dir=self.dir, **c.bounds(),
                          should_init=self.collective.should_init if self.collective is not None else None)
        run.prepare()
        saver = None
        if run.saves:
            log.info("%s saves checkpoints in %s", self.name, self.dir)
            saver = KerasSaver(built.clone, self.dir, c.keep_checkpoints)
        config = self.cluster.session_config()
        if self.collective is not None:     # the group's leader, in the server's config too (strategies/collective)
            config = self.collective.configure(config)
        run.serve(config)
        session = run.session(built.train_graph, config=config, saver=saver)
        # Every trainer waits for the others (Keras's validation runs no step, so none can be still for long).
        hooks = run.hooks(built.train_graph, session, saver=saver, save_steps=c.save_checkpoint_steps,
                          save_secs=c.save_checkpoint_secs, still_secs=None, every_trainer_waits=True, what="fit")
        session.finalize(hooks, freeze=False)
        return session, run.checkpoints

    def _run(self, built, session, checkpoints, x, y, callbacks, kwargs):
        """tf-keras's fit of the clone, a step of the training loop per batch; ``(history, trained state)``."""
        session.create()
        if checkpoints is not None:
            checkpoints.checkpoint = session.restored_from
        _handled_graphs.add(id(_graph_of(self.model)))      # its local session is no private training
        with TrainingLoop(session, name=self.name) as loop:
            built.clone.train_function = SharedTrainFunction(built.clone.train_function, built.step, loop)
            history = _plain_fit(built.clone, x, y, callbacks=list(callbacks or []) + [_stop_when(loop)], **kwargs)
            loop.end()
            state = _state(built.clone, session.global_step())
        return history, state


def _stop_when(loop):
    """A tf-keras callback: end training after the batch in which the loop was asked to stop (a SIGTERM)."""
    import tf_keras

    class StopWhenTheLoopStops(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if loop.should_stop:
                self.model.stop_training = True

    return StopWhenTheLoopStops()


def _graph_of(model):
    """The graph the user's model lives in."""
    return model.weights[0].graph if model.built and model.weights else tf1.get_default_graph()


def _state(clone, updates: int) -> tuple:
    """``(weights, optimizer weights or None, updates)`` of the trained clone."""
    try:
        optimizer = clone.optimizer.get_weights()
    except NotImplementedError:       # a wrapped tf.train optimizer keeps its slots to itself
        optimizer = None
    return clone.get_weights(), optimizer, updates


def _give(model, weights, optimizer_weights, updates: int):
    """The user's model gets the trained weights and optimizer state: its ``iterations`` is the shared count."""
    import tf_keras
    model.set_weights(weights)
    optimizer = model.optimizer
    with _graph_of(model).as_default():
        if optimizer_weights is not None and hasattr(optimizer, "_create_all_weights"):
            # A model that never trained here has no slots yet: make them, as its first update would.
            optimizer._create_all_weights(model.trainable_weights)
            try:
                optimizer.set_weights(optimizer_weights)
                return
            except ValueError as e:   # another structure (a custom optimizer): the update count still goes over
                log.debug("the optimizer's state stays on the cluster: %s", e)
        tf_keras.backend.set_value(optimizer.iterations, updates)


def _fitting_on_cluster(original):
    def fit_on_cluster(self, x=None, y=None, **kwargs):
        return fit(self, x, y, **kwargs)
    return fit_on_cluster


patches.register(patches.Patch(
    "keras.fit_on_cluster", "tf_keras.src.engine.training_v1:Model.fit",
    "tf-keras's graph-mode Model.fit trains on TF_CONFIG's cluster through tfcluster.keras.fit",
    _fitting_on_cluster, "TF1 mode, when its program uses tf.keras", params=("self", "x", "y")))


def route_fit_through_cluster():
    """Make tf-keras's graph-mode ``Model.fit`` train on TF_CONFIG's cluster (TF1 mode calls this)."""
    patches.install("keras.fit_on_cluster")
