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

from ..core import patches
from ..core.duplicates import last_failure
from ..core.tferrors import describe
from ..graph import precision
from ..runtime.server import local_session_default

log = logging.getLogger("tfcluster")

#: SessionManager's (and Supervisor's) default readiness poll, in seconds.
TF_DEFAULT_RECOVERY_WAIT = 30
#: MonitoredSession's default wait for its threads when it closes, in seconds.
TF_DEFAULT_STOP_GRACE = 120

_MS = "tensorflow.python.training.monitored_session:"
_SM = "tensorflow.python.training.session_manager:SessionManager."
TF1_MODE = "TF1 mode"


def _recreating(original):
    def _create_session(self):
        created = getattr(self, "_tfcluster_sessions", 0)
        self._tfcluster_sessions = created + 1
        if created:
            log.warning("MonitoredTrainingSession is recreating its session after %s. %s",
                        getattr(last_failure, "text", "an Aborted/Unavailable error"),
                        _what_is_lost(self._sess_creator))
        return original(self)
    return _create_session


patches.register(patches.Patch(
    "tf1.warn_on_recovery", _MS + "_RecoverableSession._create_session",
    "a MonitoredTrainingSession that recreates its session says what the chief throws away (TF: INFO only)",
    _recreating, TF1_MODE, params=("self",)))


def warn_on_recovery():
    """Log a warning each time MonitoredTrainingSession recreates its session."""
    patches.install("tf1.warn_on_recovery")


def _what_is_lost(creator) -> str:
    from tensorflow.python.checkpoint import checkpoint_management
    from tensorflow.python.training import monitored_session as ms
    inner = getattr(creator, "_session_creator", creator)
    if not isinstance(inner, ms.ChiefSessionCreator):
        return "This task is not the chief: it only waits for the model, and loses nothing."
    ckpt_dir = getattr(inner, "_checkpoint_dir", None)
    latest = checkpoint_management.latest_checkpoint(ckpt_dir) if ckpt_dir else None
    if latest:
        from ..topology.cluster import Cluster
        cluster = Cluster.from_environment()        # none after hvd.init(): Horovod's ranks hold their own copies
        where = "the variables on the ps" if cluster is not None and cluster.num_tasks("ps") else "its variables"
        return (f"As chief it restores {latest} over {where}: every step since that "
                "checkpoint is lost (save checkpoints more often to lose less).")
    return ("As chief with no checkpoint it re-initialises every variable: all training progress so far "
            "is lost (give a checkpoint_dir to keep it).")


def _polling(original, seconds):
    signature = inspect.signature(original)

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        # 30 is TF's default (also passed on by Supervisor); anything else was chosen on purpose.
        if bound.arguments.get("recovery_wait_secs") == TF_DEFAULT_RECOVERY_WAIT:
            bound.arguments["recovery_wait_secs"] = seconds
        original(*bound.args, **bound.kwargs)
    return __init__


patches.register(patches.Patch(
    "tf1.fast_ready_polling", _SM + "__init__",
    "SessionManager polls \"is the model ready?\" every 0.2 s, not TF's 30, unless the script chose (pitfalls "
    "item 4)", _polling, TF1_MODE, params=("self", "local_init_op", "ready_op", "ready_for_local_init_op",
                                           "graph", "recovery_wait_secs")))


def fast_ready_polling(seconds: float):
    """Make SessionManager poll for model readiness every ``seconds`` instead of TF's 30 (the first call's)."""
    patches.install("tf1.fast_ready_polling", seconds)


def _initialising_alone(original):
    from tensorflow.python.client import session as session_lib
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
    return prepare_session


patches.register(patches.Patch(
    "tf1.initialise_in_own_session", _SM + "prepare_session",
    "the chief initialises the model in a session it closes after, so the ps do not keep the initial values' "
    "constants for the whole run (docs/memory.md)", _initialising_alone, TF1_MODE,
    params=("self", "master", "init_op", "saver", "checkpoint_dir", "checkpoint_filename_with_path",
            "wait_for_checkpoint", "max_wait_secs", "config", "init_feed_dict", "init_fn")))


def initialise_in_own_session():
    """Make SessionManager initialise a model on a cluster in a session it closes after (the module doc)."""
    patches.install("tf1.initialise_in_own_session")


def _stopping_quickly(original, seconds):
    def __init__(self, sess, coord, stop_grace_period_secs=TF_DEFAULT_STOP_GRACE):
        if stop_grace_period_secs == TF_DEFAULT_STOP_GRACE:
            stop_grace_period_secs = seconds
        original(self, sess, coord, stop_grace_period_secs)
    return __init__


patches.register(patches.Patch(
    "tf1.quick_stop", _MS + "_CoordinatedSession.__init__",
    "a closing MonitoredSession waits a few seconds, not TF's 120, for threads that never stop (the sync "
    "chief's queue runner) unless the script chose", _stopping_quickly, TF1_MODE,
    params=("self", "sess", "coord", "stop_grace_period_secs")))


def quick_stop(seconds: float):
    """Make a closing MonitoredSession wait ``seconds`` (not TF's 120) for its threads, unless the
    script chose another ``stop_grace_period_secs`` (the first call's)."""
    patches.install("tf1.quick_stop", seconds)


def _quiet_when_joined(original):
    def _run(self, sess, enqueue_op, coord=None):
        try:
            original(self, sess, enqueue_op, coord)
        except Exception as e:  # noqa: BLE001 - only re-raised by a coordinator that was already joined
            if coord is None or not coord.joined:
                raise
            log.debug("queue runner %s ended after its coordinator was joined: %s", self.name, describe(e))
    return _run


patches.register(patches.Patch(
    "tf1.quiet_late_queue_runners", "tensorflow.python.training.queue_runner_impl:QueueRunner._run",
    "a queue-runner thread whose coordinator was already joined ends without half a traceback at exit",
    _quiet_when_joined, TF1_MODE, params=("self", "sess", "enqueue_op", "coord")))


def quiet_late_queue_runners():
    """Let a queue-runner thread whose coordinator was already joined end without a traceback."""
    patches.install("tf1.quiet_late_queue_runners")


def _stopping_quietly(original):
    import warnings

    def stop(self, *args, **kwargs):
        writer = self._summary_writer
        if writer is None or not getattr(writer, "_closed", False):
            return original(self, *args, **kwargs)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Attempting to use a closed FileWriter")
            return original(self, *args, **kwargs)
    return stop


patches.register(patches.Patch(
    "tf1.quiet_second_supervisor_stop", "tensorflow.python.training.supervisor:Supervisor.stop",
    "a Supervisor stopped twice (slim's learning.train) writes its stop record without TF's closed-FileWriter "
    "warning: nothing is lost", _stopping_quietly, TF1_MODE, params=("self",)))


def quiet_second_supervisor_stop():
    """A Supervisor stopped a second time (slim's ``learning.train`` stops it, then ``managed_session`` does)
    writes its stop record to a closed summary writer without TF's "closed FileWriter" warning: nothing is lost."""
    patches.install("tf1.quiet_second_supervisor_stop")


def _without_autotune(original):
    from ..data.pipeline import without_autotune_thread

    def make(self, *args, **kwargs):
        return original(without_autotune_thread(self), *args, **kwargs)
    return make


_ITERATORS = ("_make_one_shot_iterator", "_make_initializable_iterator")
for _name in _ITERATORS:
    patches.register(patches.Patch(
        f"tf1.iterators.{_name.strip('_')}", f"tensorflow.python.data.ops.dataset_ops:DatasetV1.{_name}",
        "a script's iterators read without tf.data's autotune thread (unless the script set autotune), so a "
        "session closes at once, not after up to 60 s", _without_autotune, TF1_MODE, params=("self",)))


def iterators_without_autotune_thread():
    """Every iterator a script makes (``make_one_shot_iterator``, ``make_initializable_iterator``, as functions
    or methods) reads its dataset without tf.data's autotune thread, unless the script set autotune."""
    for name in _ITERATORS:
        patches.install(f"tf1.iterators.{name.strip('_')}")


#: The servers a TF1 script made, ``(cluster, job, task)``: its task where TF_CONFIG gives none.
_servers = []
_warned, _reported = [], []
#: Whether the program's sessions get bfloat16 math where the CPU has it (TF1 mode; not its session fixes alone).
_math = []


def math_in_sessions():
    """The program's sessions do their matrix work in bfloat16 where the CPU has it (graph/precision.py)."""
    if not _math:
        _math.append(True)


def _noting_servers(original):
    def server_init(self, server_or_cluster_def, job_name=None, task_index=None, protocol=None, config=None,
                    start=True):
        config = _sleeping_pools(config, server_or_cluster_def, job_name, task_index)
        original(self, server_or_cluster_def, job_name, task_index, protocol, config, start)
        _servers.append((server_or_cluster_def, job_name, task_index))
    return server_init


def _sleeping_pools(config, server_or_cluster_def, job_name, task_index):
    """The program's server config (a copy), with TF's thread pools sleeping instead of spinning where the server's
    machine runs other tasks of its cluster (``Cluster.shares_machine``); the program's own config is unchanged."""
    cluster = _this_task([(server_or_cluster_def, job_name, task_index)])
    if cluster is None or cluster.task is None or not cluster.shares_machine():
        return config
    out = _copy(config)
    out.experimental.disable_thread_spinning = True
    return out


def _cluster_session(original):
    def __init__(self, target="", graph=None, config=None):
        hosted = local_session_default()
        if not target and hosted is not None:       # hvd.init() ran: Horovod's local session, on this task's server
            target, config = hosted[0].target, _under(config, hosted[1])
        cluster = _this_task(_servers)
        if cluster is not None and cluster.this_task().trains:
            target_text = target.decode() if isinstance(target, bytes) else str(target)
            own_port = cluster.address(cluster.task).rsplit(":", 1)[1]
            if target_text and not cluster.is_chief and target_text.rsplit(":", 1)[-1] == own_port:
                config = _with_filters(config, cluster.device_filters())
            elif not target_text and cluster.num_tasks("ps") and not _warned:
                _warn_if_private(graph, cluster, _warned)
            if target_text and cluster.is_chief and cluster.num_tasks("ps") and not _reported:
                _report_placement(graph, cluster, _reported)
        if _math:
            config = precision.configure(_copy(config), target=target)
        original(self, target, graph, config)
    return __init__


patches.register(patches.Patch(
    "tf1.server_task", "tensorflow.python.training.server_lib:Server.__init__",
    "a script's tf.train.Server names its task where TF_CONFIG gives none (for the session rules below); its "
    "thread pools sleep instead of spinning where its machine runs other tasks of the cluster",
    _noting_servers, TF1_MODE, params=("self", "server_or_cluster_def", "job_name", "task_index", "protocol",
                                       "config", "start")))
patches.register(patches.Patch(
    "tf1.cluster_sessions", "tensorflow.python.client.session:Session.__init__",
    "a non-chief's session gets the cluster's device filters (pitfalls item 3), the chief reports placement, "
    "a private copy of the model is named once", _cluster_session, TF1_MODE,
    params=("self", "target", "graph", "config")))


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
    patches.install("tf1.server_task")
    patches.install("tf1.cluster_sessions")


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


def _under(config, base):
    """``base`` (a ConfigProto) with ``config``'s own settings over it (``config`` may be None).

    A program's ``gpu_options.visible_device_list`` (Horovod's programs pin ``str(hvd.local_rank())``) is
    dropped where tfcluster gave the task its GPUs (``CUDA_VISIBLE_DEVICES``): the task sees only those,
    numbered from 0, and local rank 1 would name a GPU it does not have.
    """
    import os
    import tensorflow as tf
    out = tf.compat.v1.ConfigProto()
    out.CopyFrom(base)
    if config is not None:
        out.MergeFrom(config)
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            out.gpu_options.visible_device_list = base.gpu_options.visible_device_list
    return out


def _copy(config):
    """A ConfigProto of the program's own (or a new one), to change without changing the program's."""
    import tensorflow as tf
    out = tf.compat.v1.ConfigProto()
    if config is not None:
        out.CopyFrom(config)
    return out


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
