"""What legacy graph code needs to survive TF 2.21's distributed runtime.

**False duplicate aborts** (docs/pitfalls.md, item 15; :mod:`tfcluster.core.duplicates`).
TF 2.21 rejects about one step in 43,000 as a duplicate request,
although nothing was sent twice; several threads calling ``sess.run`` (queue
runners) only make steps, and so collisions, come faster. The rejected step
never ran. Running it again is what MonitoredTrainingSession ends up doing
too, but only after it has taken the error for a preemption, thrown its
session away and made the chief restore the last checkpoint (or re-initialise
every variable if there is none): the progress since then is silently lost,
and a plain Session or a Supervisor simply crashes.
:func:`tfcluster.core.duplicates.rerun_in_every_session` runs the step again at
once, for this one error only, and says so, in ``Session.run`` and in the
callables queue runners step through.

**Silent restarts.** :func:`warn_on_recovery` logs a warning whenever
MonitoredTrainingSession recreates its session, saying what the chief is about
to throw away, because TF only logs it at INFO level.

**Two-minute exits.** When a MonitoredTrainingSession closes, it waits up to
``stop_grace_period_secs`` (120 s by default) for its queue-runner threads.
Input queue runners stop at once (their queues are cancelled), but a thread
blocked elsewhere never does: SyncReplicasOptimizer's chief queue runner waits
for gradients that will never come, so a synchronous chief sat two minutes at
the end of every run before the session close cancelled that step anyway.
:func:`quick_stop` shortens that default grace; the threads end the same way.
And a thread still blocked when the session finally closes gets its step
cancelled; it reports that to the coordinator, which was already joined and so
raises it again, in the thread: half a traceback ("Exception in thread
QueueRunnerThread-sync_token_q...") lands in the middle of the script's last
lines as the interpreter exits. :func:`quiet_late_queue_runners` lets such a
thread end quietly: the run it served is already over.

**Minute-long exits after tf.data.** An iterator that goes away waits for
tf.data's autotune thread, which sleeps up to 60 s between rounds: a script's
session close could take that long. :func:`iterators_without_autotune_thread`
makes the script's iterators without it, unless the script chose autotune
itself (:func:`tfcluster.data.pipeline.without_autotune_thread`).

**Slow readiness polls** (pitfalls item 4). :func:`fast_ready_polling` makes
SessionManager poll "is the model ready?" every 0.2 s (tfcluster's READY_POLL_SECS) instead of every 30 s
when the script did not choose another interval.

**Initial values kept on the ps.** A session keeps the executors of every step
it ran, on the ps, while it is open, and the initialising step's hold its
initial values' constants, each as big as its variable (an Adagrad slot's
``constant_initializer(0.1)``): a second copy of every such slot, for the whole
run. :func:`initialise_in_own_session` makes the chief's SessionManager run
``init_op`` and ``init_fn`` in a session of their own on the same cluster,
closed once done (training/chief.py does the same for tfcluster's own sessions;
docs/memory.md).
"""

import inspect
import logging
import threading

from ..core.duplicates import last_failure
from ..core.tferrors import describe

log = logging.getLogger("tfcluster")

#: SessionManager's (and Supervisor's) default readiness poll, in seconds.
TF_DEFAULT_RECOVERY_WAIT = 30
#: MonitoredSession's default wait for its threads when it closes, in seconds.
TF_DEFAULT_STOP_GRACE = 120

_patched = set()
_lock = threading.Lock()


def warn_on_recovery():
    """Log a warning each time MonitoredTrainingSession recreates its session."""
    with _lock:
        if "recovery" in _patched:
            return
        _patched.add("recovery")
    from tensorflow.python.training import monitored_session as ms

    original = ms._RecoverableSession._create_session

    def _create_session(self):
        created = getattr(self, "_tfcluster_sessions", 0)
        self._tfcluster_sessions = created + 1
        if created:
            log.warning("MonitoredTrainingSession is recreating its session after %s. %s",
                        getattr(last_failure, "text", "an Aborted/Unavailable error"),
                        _what_is_lost(self._sess_creator))
        return original(self)

    _create_session.__wrapped__ = original
    ms._RecoverableSession._create_session = _create_session


def _what_is_lost(creator) -> str:
    from tensorflow.python.checkpoint import checkpoint_management
    from tensorflow.python.training import monitored_session as ms
    inner = getattr(creator, "_session_creator", creator)
    if not isinstance(inner, ms.ChiefSessionCreator):
        return "This task is not the chief: it only waits for the model, and loses nothing."
    ckpt_dir = getattr(inner, "_checkpoint_dir", None)
    latest = checkpoint_management.latest_checkpoint(ckpt_dir) if ckpt_dir else None
    if latest:
        return (f"As chief it restores {latest} over the variables on the ps: every step since that "
                "checkpoint is lost (save checkpoints more often to lose less).")
    return ("As chief with no checkpoint it re-initialises every variable: all training progress so far "
            "is lost (give a checkpoint_dir to keep it).")


def fast_ready_polling(seconds: float):
    """Make SessionManager poll for model readiness every ``seconds`` instead of TF's 30."""
    with _lock:
        if "poll" in _patched:
            return
        _patched.add("poll")
    from tensorflow.python.training import session_manager as sm

    original = sm.SessionManager.__init__
    signature = inspect.signature(original)

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        # 30 is TF's default (also passed on by Supervisor); anything else was chosen on purpose.
        if bound.arguments.get("recovery_wait_secs") == TF_DEFAULT_RECOVERY_WAIT:
            bound.arguments["recovery_wait_secs"] = seconds
        original(*bound.args, **bound.kwargs)

    __init__.__wrapped__ = original
    sm.SessionManager.__init__ = __init__


def initialise_in_own_session():
    """Make SessionManager initialise a model on a cluster in a session it closes after (the module doc)."""
    with _lock:
        if "init" in _patched:
            return
        _patched.add("init")
    from tensorflow.python.client import session as session_lib
    from tensorflow.python.training import session_manager as sm

    original = sm.SessionManager.prepare_session
    signature = inspect.signature(original)

    def prepare_session(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        init_op, init_fn, feed, config = a["init_op"], a["init_fn"], a["init_feed_dict"], a["config"]
        # Only on a cluster: a local session (target '') owns its variables, and closing it would lose them.
        if a["master"] and (init_op is not None or init_fn):
            def initialise(_session):
                with session_lib.Session(a["master"], graph=self._graph, config=config) as alone:
                    if init_op is not None:
                        alone.run(init_op, feed_dict=feed)
                    if init_fn:
                        init_fn(alone)
            a["init_op"], a["init_fn"] = None, initialise   # prepare_session calls it only where it would init
        return original(*bound.args, **bound.kwargs)

    prepare_session.__wrapped__ = original
    sm.SessionManager.prepare_session = prepare_session


def quick_stop(seconds: float):
    """Make a closing MonitoredSession wait ``seconds`` (not TF's 120) for its threads, unless the
    script chose another ``stop_grace_period_secs``."""
    with _lock:
        if "stop" in _patched:
            return
        _patched.add("stop")
    from tensorflow.python.training import monitored_session as ms

    original = ms._CoordinatedSession.__init__

    def __init__(self, sess, coord, stop_grace_period_secs=TF_DEFAULT_STOP_GRACE):
        if stop_grace_period_secs == TF_DEFAULT_STOP_GRACE:
            stop_grace_period_secs = seconds
        original(self, sess, coord, stop_grace_period_secs)

    __init__.__wrapped__ = original
    ms._CoordinatedSession.__init__ = __init__


def quiet_late_queue_runners():
    """Let a queue-runner thread whose coordinator was already joined end without a traceback."""
    with _lock:
        if "late" in _patched:
            return
        _patched.add("late")
    from tensorflow.python.training import queue_runner_impl as qr

    original = qr.QueueRunner._run

    def _run(self, sess, enqueue_op, coord=None):
        try:
            original(self, sess, enqueue_op, coord)
        except Exception as e:  # noqa: BLE001 - only re-raised by a coordinator that was already joined
            if coord is None or not coord.joined:
                raise
            log.debug("queue runner %s ended after its coordinator was joined: %s", self.name, describe(e))

    _run.__wrapped__ = original
    qr.QueueRunner._run = _run


def quiet_second_supervisor_stop():
    """A Supervisor stopped a second time (slim's ``learning.train`` stops it, then ``managed_session`` does)
    writes its stop record to a closed summary writer without TF's "closed FileWriter" warning: nothing is lost."""
    with _lock:
        if "supervisor" in _patched:
            return
        _patched.add("supervisor")
    import warnings

    from tensorflow.python.training import supervisor

    original = supervisor.Supervisor.stop

    def stop(self, *args, **kwargs):
        writer = self._summary_writer
        if writer is None or not getattr(writer, "_closed", False):
            return original(self, *args, **kwargs)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Attempting to use a closed FileWriter")
            return original(self, *args, **kwargs)

    stop.__wrapped__, stop.__doc__ = original, original.__doc__
    supervisor.Supervisor.stop = stop


def iterators_without_autotune_thread():
    """Every iterator a script makes (``make_one_shot_iterator``, ``make_initializable_iterator``, as functions
    or methods) reads its dataset without tf.data's autotune thread, unless the script set autotune."""
    with _lock:
        if "iterators" in _patched:
            return
        _patched.add("iterators")
    from tensorflow.python.data.ops import dataset_ops

    from ..data.pipeline import without_autotune_thread
    v1 = dataset_ops.DatasetV1
    for name in ("_make_one_shot_iterator", "_make_initializable_iterator"):
        original = getattr(v1, name)

        def make(self, *args, _original=original, **kwargs):
            return _original(without_autotune_thread(self), *args, **kwargs)
        make.__wrapped__, make.__doc__ = original, original.__doc__
        setattr(v1, name, make)


def cluster_sessions():
    """Sessions of a TF1 script that see only what they need, and say when they train a private copy.

    - A non-chief worker's session on its own server gets the cluster's device
      filters (the ps tasks and itself) when the script gives none: otherwise
      it waits for every other task, and a chief that finished and exited
      leaves it waiting forever (pitfalls item 3). The chief's sessions keep
      the whole view: a TF1 chief may place ops on the other workers (in-graph).
    - The chief's first session on the cluster says where the script placed
      its variables, bytes per task (the full list at debug level), as ``fit``
      does: a model that is not on the ps, or all on one of several, shows.
    - A trainer of a cluster with ps tasks that opens a local session
      (target ``''``) on a graph whose trainable variables are not on the ps
      trains a copy nobody else sees; it says so once, with the fix.

    This process's task comes from TF_CONFIG or, without one, from the
    ``tf.train.Server`` the script made (``--job_name``/``--task_index``).
    """
    with _lock:
        if "sessions" in _patched:
            return
        _patched.add("sessions")
    from tensorflow.python.client import session as session_lib
    from tensorflow.python.training import server_lib
    servers = []
    original_server = server_lib.Server.__init__

    def server_init(self, server_or_cluster_def, job_name=None, task_index=None, *args, **kwargs):
        original_server(self, server_or_cluster_def, job_name, task_index, *args, **kwargs)
        servers.append((server_or_cluster_def, job_name, task_index))
    server_init.__wrapped__ = original_server
    server_lib.Server.__init__ = server_init

    original = session_lib.Session.__init__
    warned, reported = [], []

    def __init__(self, target="", graph=None, config=None):
        cluster = _this_task(servers)
        if cluster is not None and cluster.role() in ("chief", "worker"):
            target_text = target.decode() if isinstance(target, bytes) else str(target)
            own_port = cluster.address(cluster.task).rsplit(":", 1)[1]
            if target_text and not cluster.is_chief and target_text.rsplit(":", 1)[-1] == own_port:
                config = _with_filters(config, cluster.device_filters())
            elif not target_text and cluster.num_tasks("ps") and not warned:
                _warn_if_private(graph, cluster, warned)
            if target_text and cluster.is_chief and cluster.num_tasks("ps") and not reported:
                _report_placement(graph, cluster, reported)
        original(self, target, graph, config)

    __init__.__wrapped__ = original
    session_lib.Session.__init__ = __init__


def _this_task(servers):
    """This process's task of its cluster: TF_CONFIG's, else the last tf.train.Server's; None if neither."""
    from ..topology.cluster import Cluster
    try:
        cluster = Cluster.from_environment()
        if cluster is not None:
            return cluster
        if servers:
            spec, job, index = servers[-1]
            import tensorflow as tf
            jobs = tf.train.ClusterSpec(spec).as_dict()
            if job is None:
                return None
            return Cluster({j: (a if isinstance(a, list) else list(a.values())) for j, a in jobs.items()},
                           (job, index or 0))
    except Exception:  # a cluster tfcluster cannot read is the script's business
        return None
    return None


def _with_filters(config, filters):
    import tensorflow as tf
    if config is not None and config.device_filters:
        return config
    out = tf.compat.v1.ConfigProto()
    if config is not None:
        out.CopyFrom(config)
    out.device_filters.extend(filters)
    return out


def _warn_if_private(graph, cluster, warned):
    import tensorflow as tf
    g = graph or tf.compat.v1.get_default_graph()
    from .. import keras
    from ..estimator.inference import only_infers
    if keras.trains_on_cluster(g):
        return      # a tf.keras model whose fit trains on the cluster: this session only uses it
    if only_infers(g):
        return      # an Estimator's evaluate, predict or export, after training on the cluster
    trainable = g.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    # A training graph has a global step; a model built only to evaluate or to copy weights has none.
    training = tf.compat.v1.train.get_global_step(g) is not None
    if training and trainable and not any("/job:ps" in (v.device or "") for v in trainable):
        warned.append(True)
        log.warning("%s trains a private copy of its model: a local session (target '') on variables that are "
                    "not on the ps, so no other worker sees its updates; place them with "
                    "tf.train.replica_device_setter(cluster=...) and run on server.target (docs/tf1.md)",
                    cluster.task)


def _report_placement(graph, cluster, reported):
    import tensorflow as tf
    from ..graph.placement import human_bytes, placement_report, record_ps_state
    report = placement_report(graph or tf.compat.v1.get_default_graph(),
                              devices=[t.device for t in cluster.tasks(("ps",))])
    if not report.records:
        return      # a session before the model is built
    reported.append(True)
    if cluster.is_chief:
        record_ps_state(report.totals())    # the launcher's --ps-memory line names what each ps held
    totals = ", ".join(f"{d} {human_bytes(b)}" for d, b in report.totals().items())
    log.info("%s placed %d variable(s): %s (ps imbalance %.1f%%)", cluster.task, len(report.records), totals,
             100 * report.imbalance())
    log.debug("%s", report.format())
