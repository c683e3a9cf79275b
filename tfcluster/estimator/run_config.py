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


_REFUSED = {
    "train_distribute": "tfcluster's cluster (TF_CONFIG with ps tasks) and tf.train.SyncReplicasOptimizer for "
                        "sync; tf.distribute strategies are eager-mode",
    "eval_distribute": "a plain evaluation (the evaluator task evaluates in one process)",
    "experimental_distribute": "tfcluster's cluster (TF_CONFIG with ps tasks)",
}


class RunConfig:
    """How an Estimator runs (TF 1.x's ``tf.estimator.RunConfig``); the cluster and role come from TF_CONFIG."""

    def __init__(self, model_dir: Optional[str] = None, tf_random_seed: Optional[int] = None,
                 save_summary_steps: int = 100, save_checkpoints_steps=_USE_DEFAULT,
                 save_checkpoints_secs=_USE_DEFAULT, session_config=None, keep_checkpoint_max: int = 5,
                 keep_checkpoint_every_n_hours: float = 10000, log_step_count_steps: int = 100,
                 train_distribute=None, device_fn=None, protocol=None, eval_distribute=None,
                 experimental_distribute=None, experimental_max_worker_delay_secs=None,
                 session_creation_timeout_secs: float = 7200, checkpoint_save_graph_def: bool = True):
        for name, value in (("train_distribute", train_distribute), ("eval_distribute", eval_distribute),
                            ("experimental_distribute", experimental_distribute)):
            if value is not None:
                raise SpecError(f"RunConfig({name}=...) is not covered; use {_REFUSED[name]} (docs/estimator.md)")
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
        self._cluster = Cluster.from_environment()

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
        return self._cluster.role() in ("chief", "worker") and self._cluster.is_chief

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
    train_distribute = property(lambda self: None, doc="Not covered (see docs/estimator.md).")
    eval_distribute = property(lambda self: None, doc="Not covered (see docs/estimator.md).")

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
