"""``tf.estimator.RunConfig``: where the model lives, how often it saves and logs, and this task's role.

The role comes from ``TF_CONFIG``, as in TF 1.x: ``chief`` (or its TF 1.x name
``master``) trains and saves, ``worker`` trains, ``ps`` serves the variables,
``evaluator`` evaluates each new checkpoint outside the cluster. Unlike TF 1.x,
a cluster without a chief makes ``worker`` 0 the chief instead of failing.
"""

import copy
import os
from typing import Optional

from ..core.errors import SpecError
from ..topology.cluster import Cluster, Task

_USE_DEFAULT = object()
#: TF 1.x's save_checkpoints_secs when neither it nor save_checkpoints_steps is given.
DEFAULT_SAVE_SECS = 600


class TaskType:
    """The task types of TF_CONFIG that have a role."""

    MASTER = "master"
    CHIEF = "chief"
    WORKER = "worker"
    PS = "ps"
    EVALUATOR = "evaluator"


def _distribute(name: str, strategy, cluster, entry: Optional[str] = None):
    """``strategy`` if tfcluster trains it as asked here, else one line (SpecError).

    A strategy TF1 mode gives (``tf.contrib.distribute``, :mod:`tfcluster.tf1.distribute`)
    checks itself against the cluster (``check``) and says how it trains
    (``note``); any other object, TF 2's eager strategies among them, is refused.
    """
    if strategy is None:
        return None
    entry = entry or f"RunConfig({name}=...)"
    if not callable(getattr(type(strategy), "check", None)):
        raise SpecError(f"{entry} takes a tf.contrib.distribute strategy under TF1 mode (docs/tf1.md), not "
                        f"{type(strategy).__name__}; for sync training use tf.train.SyncReplicasOptimizer "
                        "(docs/estimator.md)")
    if name == "eval_distribute":
        # The evaluation runs in one process on one device: its metrics do not depend on how a strategy
        # would have split the batches.
        return strategy
    strategy.check(cluster, entry, replicas_ok=True)     # a model_fn runs on every replica (estimator/replicas.py)
    strategy.note(cluster, entry)
    return strategy


class RunConfig:
    """How an Estimator runs (TF 1.x's ``tf.estimator.RunConfig``); the cluster and role come from TF_CONFIG."""

    def __init__(self, model_dir: Optional[str] = None, tf_random_seed: Optional[int] = None,
                 save_summary_steps: int = 100, save_checkpoints_steps=_USE_DEFAULT,
                 save_checkpoints_secs=_USE_DEFAULT, session_config=None, keep_checkpoint_max: int = 5,
                 keep_checkpoint_every_n_hours: float = 10000, log_step_count_steps: int = 100,
                 train_distribute=None, device_fn=None, protocol=None, eval_distribute=None,
                 experimental_distribute=None, experimental_max_worker_delay_secs=None,
                 session_creation_timeout_secs: float = 7200, checkpoint_save_graph_def: bool = True):
        self._cluster = Cluster.from_environment()
        if experimental_distribute is not None:
            if train_distribute is not None or eval_distribute is not None:
                raise SpecError("RunConfig: give experimental_distribute or train_distribute/eval_distribute, "
                                "not both")
            train_distribute = getattr(experimental_distribute, "train_distribute", None)
            eval_distribute = getattr(experimental_distribute, "eval_distribute", None)
            entry = "RunConfig(experimental_distribute=DistributeConfig(train_distribute=...))"
        else:
            entry = None
        self._train_distribute = _distribute("train_distribute", train_distribute, self._cluster, entry)
        self._eval_distribute = _distribute("eval_distribute", eval_distribute, self._cluster)
        if save_checkpoints_steps is _USE_DEFAULT and save_checkpoints_secs is _USE_DEFAULT:
            save_checkpoints_steps, save_checkpoints_secs = None, DEFAULT_SAVE_SECS
        elif save_checkpoints_steps is _USE_DEFAULT:
            save_checkpoints_steps = None
        elif save_checkpoints_secs is _USE_DEFAULT:
            save_checkpoints_secs = None
        if save_checkpoints_steps is not None and save_checkpoints_secs is not None:
            raise SpecError("RunConfig: give save_checkpoints_steps or save_checkpoints_secs, not both")
        self._model_dir = os.path.abspath(model_dir) if model_dir else None
        self._tf_random_seed = tf_random_seed
        self._save_summary_steps = save_summary_steps
        self._save_checkpoints_steps = save_checkpoints_steps
        self._save_checkpoints_secs = save_checkpoints_secs
        self._session_config = session_config
        self._keep_checkpoint_max = keep_checkpoint_max
        self._keep_checkpoint_every_n_hours = keep_checkpoint_every_n_hours
        self._log_step_count_steps = log_step_count_steps
        self._device_fn = device_fn
        self._protocol = protocol
        self._session_creation_timeout_secs = session_creation_timeout_secs
        self._checkpoint_save_graph_def = checkpoint_save_graph_def

    # -------------------------------------------------------------- role
    @property
    def cluster(self) -> Optional[Cluster]:
        """tfcluster's view of TF_CONFIG (None without one)."""
        return self._cluster

    @property
    def cluster_spec(self):
        """The ``tf.train.ClusterSpec`` of TF_CONFIG (empty without one)."""
        import tensorflow as tf
        return self._cluster.to_cluster_spec() if self._cluster is not None else tf.train.ClusterSpec({})

    @property
    def _task(self) -> Optional[Task]:
        return None if self._cluster is None else self._cluster.task

    @property
    def task_type(self) -> str:
        """This task's type (``worker`` without TF_CONFIG, as in TF 1.x)."""
        return self._task.job if self._task is not None else TaskType.WORKER

    @property
    def task_id(self) -> int:
        """This task's index in its job."""
        return self._task.index if self._task is not None else 0

    @property
    def is_chief(self) -> bool:
        """True for the task that initialises, checkpoints and writes summaries."""
        if self._task is None:
            return True
        if self._task.job == TaskType.EVALUATOR:
            return False
        return self._cluster.this_task().trains and self._cluster.is_chief

    @property
    def master(self) -> str:
        """This task's own gRPC target (``''`` without a cluster, or for the evaluator)."""
        if self._task is None or self._task.job == TaskType.EVALUATOR:
            return ""
        return f"grpc://{self._cluster.address(self._task)}"

    @property
    def evaluation_master(self) -> str:
        """Evaluation runs in one plain process."""
        return ""

    @property
    def num_ps_replicas(self) -> int:
        """ps tasks of the cluster."""
        return 0 if self._cluster is None else self._cluster.num_tasks("ps")

    @property
    def num_worker_replicas(self) -> int:
        """Tasks that train: the chief (or master) and the workers (1 without a cluster)."""
        return 1 if self._cluster is None else self._cluster.num_replicas

    @property
    def global_id_in_cluster(self) -> int:
        """This task's index among the trainers, chief first, then the ps tasks (TF 1.x's numbering)."""
        if self._task is None:
            return 0
        order = self._cluster.trainers() + self._cluster.tasks(("ps",))
        return order.index(self._task) if self._task in order else len(order)

    @property
    def service(self):
        """Not used by tfcluster."""
        return None

    # ---------------------------------------------------------- settings
    model_dir = property(lambda self: self._model_dir, doc="Where checkpoints and summaries go.")
    tf_random_seed = property(lambda self: self._tf_random_seed, doc="The graph's random seed.")
    save_summary_steps = property(lambda self: self._save_summary_steps, doc="Summaries every N steps.")
    save_checkpoints_steps = property(lambda self: self._save_checkpoints_steps, doc="Checkpoints every N steps.")
    save_checkpoints_secs = property(lambda self: self._save_checkpoints_secs, doc="Checkpoints every N s.")
    session_config = property(lambda self: self._session_config, doc="The ConfigProto of the sessions.")
    keep_checkpoint_max = property(lambda self: self._keep_checkpoint_max, doc="Checkpoints kept.")
    keep_checkpoint_every_n_hours = property(lambda self: self._keep_checkpoint_every_n_hours,
                                             doc="One checkpoint kept for good every N hours.")
    log_step_count_steps = property(lambda self: self._log_step_count_steps, doc="A loss line every N steps.")
    device_fn = property(lambda self: self._device_fn, doc="A device function for the model's ops, or None.")
    protocol = property(lambda self: self._protocol, doc="The server protocol (grpc).")
    session_creation_timeout_secs = property(lambda self: self._session_creation_timeout_secs,
                                             doc="How long a worker waits for the chief's model.")
    train_distribute = property(lambda self: self._train_distribute,
                                doc="The strategy training was asked to use (TF1 mode's, checked against the cluster).")
    eval_distribute = property(lambda self: self._eval_distribute,
                               doc="The evaluation's strategy (the evaluation runs in one process either way).")

    def replace(self, **kwargs) -> "RunConfig":
        """A copy with the given settings changed."""
        known = {"model_dir", "tf_random_seed", "save_summary_steps", "save_checkpoints_steps",
                 "save_checkpoints_secs", "session_config", "keep_checkpoint_max", "keep_checkpoint_every_n_hours",
                 "log_step_count_steps", "device_fn", "protocol", "session_creation_timeout_secs"}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise SpecError(f"RunConfig.replace: cannot change {', '.join(unknown)}")
        new = copy.copy(self)
        if "save_checkpoints_steps" in kwargs and kwargs["save_checkpoints_steps"] is not None:
            new._save_checkpoints_secs = None
        if "save_checkpoints_secs" in kwargs and kwargs["save_checkpoints_secs"] is not None:
            new._save_checkpoints_steps = None
        for k, v in kwargs.items():
            setattr(new, "_" + k, os.path.abspath(v) if k == "model_dir" and v else v)
        return new

    def __repr__(self):
        where = f"{self.task_type}:{self.task_id}" if self._task is not None else "one process"
        return f"RunConfig(model_dir={self._model_dir!r}, {where})"
