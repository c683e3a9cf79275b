"""``tf.contrib.distribute`` in TF1 mode: TF 1.x's strategy classes, as requests tfcluster trains or refuses.

A TF 1.11-1.13 program names a strategy and hands it to
``compile(distribute=...)`` or ``RunConfig(train_distribute=...)``. TF 2.21's
strategies are eager-mode objects those entry points no longer take. Here each
class records what the program asked for (how many replicas per worker, on
which devices, how gradients combine) and :meth:`TF1Strategy.check` says, in
one line, when tfcluster cannot train it that way.

Covered (docs/tf1.md, "Distribution strategies"): every strategy with one
replica per worker, as TF 1.x ran them on a machine without GPUs (its
``MirroredStrategy()`` mirrored over the GPUs, else used the CPU alone);
several replicas in one process under Keras's compile
(:mod:`tfcluster.keras.towers`) and ``model_to_estimator``; several replicas
in one process, and ``CollectiveAllReduceStrategy`` across TF_CONFIG's
workers, under an Estimator's ``RunConfig``
(:mod:`tfcluster.estimator.replicas`); ``CollectiveAllReduceStrategy`` across
TF_CONFIG's workers under Keras's compile, and TF 1.14's
``MultiWorkerMirroredStrategy`` scope (:mod:`tfcluster.keras.collective`);
TF 1.14's ``tf.distribute.experimental`` names of the two that read
TF_CONFIG; ``ParameterServerStrategy`` under a TF_CONFIG with ps tasks, which
is tfcluster's between-graph training; ``eval_distribute`` (the evaluation
runs in one process; its metrics do not depend on how batches were split).
Not yet covered, and refused in one line naming what to use instead: several
replicas per worker on a cluster under Keras's compile, and under
``model_to_estimator`` on ps tasks; ps tasks beside Keras's all-reduce (an
Estimator's idle and exit when the workers are done).
"""

import collections
import contextlib
import logging
from typing import Optional

from ..core import patches
from ..core.errors import SpecError, TF1RemovedError

log = logging.getLogger("tfcluster")
#: The all-reduce scopes open now (``with MultiWorkerMirroredStrategy().scope():``): a compile in one all-reduces.
_SCOPES = []
#: Who installs the tf-keras patches (docs/patches.md).
TF1_MODE_KERAS = "TF1 mode, when its program uses tf.keras"


def _gpu_count() -> int:
    # CUDA_VISIBLE_DEVICES or nvidia-smi, as the launcher counts them: asking TensorFlow would initialise CUDA,
    # which prints an error line on every machine without a GPU driver.
    from ..topology.devices import list_gpus
    return len(list_gpus()[0])


class CrossDeviceOps:
    """How a strategy combines its replicas' gradients (NCCL, hierarchical copy, one device).

    tfcluster sums a worker's tower gradients on one device whatever is named:
    the choice changes only the speed on GPUs, never the update.
    """

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def __repr__(self):
        return f"{type(self).__name__}()"


class AllReduceCrossDeviceOps(CrossDeviceOps):
    """TF 1.x's all-reduce across local devices (``all_reduce_alg='nccl'`` or ``'hierarchical_copy'``)."""


class NcclAllReduce(CrossDeviceOps):
    """TF 1.13's NCCL all-reduce."""


class HierarchicalCopyAllReduce(CrossDeviceOps):
    """TF 1.13's hierarchical copy all-reduce."""


class ReductionToOneDevice(CrossDeviceOps):
    """Sum on one device, then copy back."""


class TF1Strategy:
    """A TF 1.x strategy as a program named it: its kind, its devices per worker, the replicas they make."""

    kind = "mirrored"
    #: Where a program found the class (``tf.distribute.experimental`` for TF 1.14's).
    namespace = "tf.contrib.distribute"

    @property
    def name(self) -> str:
        """The class's name as the program wrote it (TF 1.14's ParameterServerStrategy is one name for two)."""
        return type(self).__name__.replace("V1", "")

    def __init__(self, devices=None, num_gpus: Optional[int] = None, cross_device_ops=None):
        if num_gpus is not None and (isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 0):
            raise SpecError(f"{self.name}: the number of GPUs must be a whole number >= 0, got {num_gpus!r}")
        if devices is not None and (isinstance(devices, str) or not list(devices)):
            raise SpecError(f"{self.name}: devices must be a non-empty list of device names, got "
                            f"{devices!r}")
        self.devices = None if devices is None else list(devices)
        self.num_gpus = num_gpus
        self.cross_device_ops = cross_device_ops

    # ------------------------------------------------------------ replicas
    @property
    def replicas_per_worker(self) -> int:
        """Replicas inside one worker: the devices named, else the GPUs asked for, else every GPU, else 1."""
        if self.devices is not None:
            return len(self.devices)
        if self.num_gpus is not None:
            return max(self.num_gpus, 1)
        return max(_gpu_count(), 1)

    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas whose gradients make one update (TF 1.x's member of that name)."""
        return self.replicas_per_worker

    def towers(self):
        """The replicas' devices as tfcluster's towers: the devices named, else N GPUs, else N virtual CPU devices."""
        from ..strategies.towers import Towers
        return Towers(self.devices if self.devices is not None else self.replicas_per_worker)

    def where(self) -> str:
        """The replicas' devices in words, e.g. ``'/cpu:0 (no GPU, none asked for)'``."""
        if self.devices is not None:
            return ", ".join(self.devices)
        n = self.replicas_per_worker
        if self.num_gpus != 0 and _gpu_count() >= n:
            return f"{n} GPU(s)"
        if n == 1:
            return "/cpu:0 (no GPU, none asked for)" if self.num_gpus is None else "/cpu:0"
        return f"{n} virtual CPU devices"

    def describe(self) -> str:
        """e.g. ``MirroredStrategy: 1 replica on /cpu:0 (no GPU, none asked for)``."""
        return f"{self.name}: {self.replicas_per_worker} replica(s) per worker on {self.where()}"

    # ------------------------------------------------------------- checks
    def check(self, cluster, entry: str, replicas_ok: bool = False) -> None:
        """Refuse in one line what tfcluster cannot train as asked at ``entry`` (e.g. ``compile(distribute=...)``).

        ``cluster`` is TF_CONFIG's (None without one); ``replicas_ok``: the
        entry builds several replicas in one process (an Estimator's model_fn).
        """
        name = self.name
        if self.replicas_per_worker > 1 and not (replicas_ok and cluster is None):
            raise SpecError(f"{entry} with {name} on {self.replicas_per_worker} replicas per worker is not covered "
                            "yet; train the model_fn with tfcluster.fit(..., strategy='mirrored', towers="
                            f"{self.replicas_per_worker}), or give one device (docs/tf1.md)")
        if cluster is not None and (cluster.num_replicas > 1 or cluster.num_tasks("ps")):
            raise SpecError(f"{entry} with {name} trains in one process, but TF_CONFIG has a cluster; use "
                            "tf.contrib.distribute.ParameterServerStrategy() with ps tasks (tfcluster's "
                            "between-graph training), or no strategy (docs/tf1.md)")

    def note(self, cluster, entry: str) -> None:
        """One line saying how the strategy trains here (once :meth:`check` passed)."""
        log.info("%s: %s, %s", entry, self.describe(), "the update of one process" if self.replicas_per_worker == 1
                 else "one update per step from all of them")

    def scope(self):
        """A context for building the model: with one replica per worker, nothing to lay out."""
        self.check(None, f"{self.name}.scope()")
        return contextlib.nullcontext(self)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise TF1RemovedError(f"{self.namespace}.{self.name}.{name}",
                              "compile(distribute=...) or RunConfig(train_distribute=...) with the strategy, "
                              "which is what TF1 mode covers of it (docs/tf1.md)")

    def __repr__(self):
        return f"<TF1 mode's {self.describe()}>"


class MirroredStrategy(TF1Strategy):
    """TF 1.x's ``tf.contrib.distribute.MirroredStrategy``: replicas on one worker's devices."""

    def __init__(self, devices=None, num_gpus=None, num_gpus_per_worker=None, cross_device_ops=None,
                 auto_shard_dataset=False, cross_tower_ops=None):
        super().__init__(devices, num_gpus if num_gpus is not None else num_gpus_per_worker,
                         cross_device_ops or cross_tower_ops)


class OneDeviceStrategy(TF1Strategy):
    """TF 1.x's ``tf.contrib.distribute.OneDeviceStrategy``: one replica on ``device``."""

    def __init__(self, device):
        super().__init__([device])


class CollectiveAllReduceStrategy(TF1Strategy):
    """TF 1.x's ``tf.contrib.distribute.CollectiveAllReduceStrategy``: all-reduce across TF_CONFIG's workers."""

    kind = "collective"

    def __init__(self, num_gpus_per_worker=0):
        super().__init__(num_gpus=num_gpus_per_worker)

    def check(self, cluster, entry: str, replicas_ok: bool = False) -> None:
        """One worker (or none) is one process's training; across workers, all-reduce with one replica per
        worker (an Estimator's model_fn, a Keras model's fit)."""
        if cluster is not None and cluster.num_replicas > 1:
            if self.replicas_per_worker > 1 and not replicas_ok:
                raise SpecError(f"{entry} with CollectiveAllReduceStrategy across {cluster.num_replicas} workers "
                                f"and {self.replicas_per_worker} replicas per worker is not covered yet; give each "
                                "worker one device (num_gpus_per_worker=0 or 1) (docs/tf1.md)")
            # An Estimator's ps tasks idle and exit when the workers are done, as TF 1.x's distribute coordinator
            # ran them (it left them in server.join()); Keras's ps tasks have no such role here.
            if cluster.num_tasks("ps") and not replicas_ok:
                raise SpecError(f"{entry} with CollectiveAllReduceStrategy uses no ps tasks, and TF_CONFIG's "
                                "cluster has some; start it without them (tfcluster local --ps 0 --workers 2), or "
                                "use tf.contrib.distribute.ParameterServerStrategy() (docs/tf1.md)")
            return
        super().check(None, entry, replicas_ok)

    def note(self, cluster, entry: str) -> None:
        """One line saying how the strategy trains here (once :meth:`check` passed)."""
        if cluster is None or cluster.num_replicas < 2:
            return super().note(cluster, entry)
        idle = (f"; the {cluster.num_tasks('ps')} ps task(s) hold nothing and exit when the workers are done"
                if cluster.num_tasks("ps") else "")
        log.info("%s: %s; each of the %d workers holds a copy, their gradients all-reduced into one update per "
                 "step (tfcluster's collective strategy)%s", entry, self.describe(), cluster.num_replicas, idle)


class ParameterServerStrategy(TF1Strategy):
    """TF 1.x's ``tf.contrib.distribute.ParameterServerStrategy``: variables on TF_CONFIG's ps tasks."""

    kind = "ps"

    def __init__(self, num_gpus_per_worker=0):
        super().__init__(num_gpus=num_gpus_per_worker)

    def check(self, cluster, entry: str, replicas_ok: bool = False) -> None:
        """With ps tasks: tfcluster's between-graph training; without a cluster: one process."""
        if cluster is not None and not cluster.num_tasks("ps"):
            raise SpecError(f"{entry} with ParameterServerStrategy needs ps tasks, and TF_CONFIG's cluster has none; "
                            "add them (tfcluster local --ps 1), or name no strategy (docs/tf1.md)")
        # Several replicas per worker: towers on each worker (an Estimator's model_fn), else refused.
        super().check(None if replicas_ok or self.replicas_per_worker == 1 else cluster, entry, replicas_ok)

    def note(self, cluster, entry: str) -> None:
        """One line saying how the strategy trains here (once :meth:`check` passed)."""
        if cluster is None or not cluster.num_tasks("ps"):
            return super().note(cluster, entry)
        log.info("%s: %s; variables on the ps tasks, each worker updates them (tfcluster's between-graph "
                 "training)", entry, self.describe())


class MultiWorkerMirroredStrategy(CollectiveAllReduceStrategy):
    """TF 1.14's ``tf.distribute.experimental.MultiWorkerMirroredStrategy``: all-reduce across TF_CONFIG's workers,
    on every GPU of each (one replica on the CPU without one)."""

    namespace = "tf.distribute.experimental"

    def __init__(self, communication=None, cluster_resolver=None):
        TF1Strategy.__init__(self, num_gpus=None)
        _no_resolver(cluster_resolver, self.name)

    @contextlib.contextmanager
    def scope(self):
        """A Keras model compiled in this scope trains by all-reduce across TF_CONFIG's workers."""
        from ..topology.cluster import Cluster
        cluster = Cluster.from_environment()
        entry = f"{self.name}.scope()"
        self.check(cluster, entry)
        self.note(cluster, entry)
        _SCOPES.append(self)
        try:
            yield self
        finally:
            _SCOPES.remove(self)


class ParameterServerStrategyV1(ParameterServerStrategy):
    """TF 1.14's ``tf.distribute.experimental.ParameterServerStrategy``: variables on TF_CONFIG's ps tasks."""

    namespace = "tf.distribute.experimental"

    def __init__(self, cluster_resolver=None):
        TF1Strategy.__init__(self, num_gpus=None)
        _no_resolver(cluster_resolver, self.name)

    def scope(self):
        """Keras under this scope trains on the ps tasks, shared by every worker (TF 1.14 refused Keras here)."""
        from ..topology.cluster import Cluster
        cluster = Cluster.from_environment()
        entry = "ParameterServerStrategy.scope()"
        self.check(cluster, entry)
        self.note(cluster, entry)
        return contextlib.nullcontext(self)


def _no_resolver(resolver, name: str):
    if resolver is not None:
        raise SpecError(f"{name}(cluster_resolver=...) is not covered; TF1 mode reads the cluster from TF_CONFIG "
                        "(tfcluster local and tfcluster start set it)")


class DistributeConfig(collections.namedtuple("DistributeConfig",
                                              ["train_distribute", "eval_distribute", "remote_cluster"])):
    """TF 1.x's ``tf.contrib.distribute.DistributeConfig`` for ``RunConfig(experimental_distribute=...)``."""

    def __new__(cls, train_distribute=None, eval_distribute=None, remote_cluster=None):
        if remote_cluster is not None:
            raise SpecError("DistributeConfig(remote_cluster=...) (a client driving a remote cluster) is not "
                            "covered; run the program on every task with TF_CONFIG (tfcluster local --tf1, or "
                            "tfcluster start --tf1)")
        return super().__new__(cls, train_distribute, eval_distribute, remote_cluster)


def _taking_strategies(original):
    def compile(self, *args, distribute=None, **kwargs):
        from ..topology.cluster import Cluster
        if distribute is None and _SCOPES:     # checked and noted by the scope
            if Cluster.from_environment() is not None:
                from ..keras.collective import request
                request(self)
            return original(self, *args, **kwargs)
        if not isinstance(distribute, TF1Strategy):
            return original(self, *args, distribute=distribute, **kwargs)
        cluster = Cluster.from_environment()
        # Several replicas: towers in one process (tfcluster/keras/towers.py); on a cluster, refused.
        distribute.check(cluster, "compile(distribute=...)", replicas_ok=cluster is None)
        distribute.note(cluster, "compile(distribute=...)")
        if distribute.kind == "collective" and cluster is not None:
            from ..keras.collective import request
            request(self)       # fit all-reduces across the workers (tfcluster/keras/collective.py)
        # fit then trains as TF1 mode's fit does: alone (on the towers), by all-reduce, or on TF_CONFIG's ps tasks
        result = original(self, *args, distribute=None, **kwargs)
        if distribute.replicas_per_worker > 1:
            from ..keras.towers import use_towers
            use_towers(self, distribute.towers(), args, kwargs)
        return result
    return compile


patches.register(patches.Patch(
    "tf1.keras_compile_strategies", "tf_keras.src.engine.training_v1:Model.compile",
    "tf-keras's graph-mode compile(distribute=...) takes TF1 mode's strategies and trains on the cluster",
    _taking_strategies, TF1_MODE_KERAS, params=("self",)))


def keras_compile_takes_strategies():
    """Make tf-keras's graph-mode ``compile(distribute=...)`` take these strategies (TF1 mode calls this)."""
    patches.install("tf1.keras_compile_strategies")


def experimental_members() -> dict:
    """The names of TF 1.14's ``tf.distribute.experimental`` TF1 mode gives as tfcluster's (the rest are TF's)."""
    return {"MultiWorkerMirroredStrategy": MultiWorkerMirroredStrategy,
            "ParameterServerStrategy": ParameterServerStrategyV1}


def members() -> dict:
    """The names of ``tf.contrib.distribute`` TF1 mode gives."""
    return {c.__name__: c for c in (MirroredStrategy, OneDeviceStrategy, CollectiveAllReduceStrategy,
                                    ParameterServerStrategy, DistributeConfig, CrossDeviceOps,
                                    AllReduceCrossDeviceOps, NcclAllReduce, HierarchicalCopyAllReduce,
                                    ReductionToOneDevice)}
