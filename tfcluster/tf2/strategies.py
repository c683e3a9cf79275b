"""One process's strategies as one model across the cluster: ``MirroredStrategy`` and its kin on TF_CONFIG's trainers.

A TF 2 program that builds ``tf.distribute.MirroredStrategy()`` (the tutorials'
``fit`` and custom loops), ``CentralStorageStrategy`` or ``OneDeviceStrategy``
trains over the devices of its own process. Under TF2 mode, on a cluster of
several trainers (TF_CONFIG's chief and workers), the same call gives TF's
``MultiWorkerMirroredStrategy`` over every trainer: each trainer's local devices
are its replicas, gradients are all-reduced across trainers,
``num_replicas_in_sync`` is the cluster's, and a dataset the strategy
distributes is split so each global batch is shared out, none read twice (TF's
auto-sharding). With one trainer, or no cluster, the call is TF's own.

Why TF's ``MultiWorkerMirroredStrategy`` and not tfcluster's collective: these
programs run eagerly in ``tf.function``\\ s, which TF's strategy drives; tfcluster's
collective strategy builds TF 1.x graphs for ``fit`` (docs/tf2.md).
"""

import itertools
import logging
import threading
from typing import Optional

from ..core.errors import StrategyArgumentError
from ..core.patches import Patch, register
from ..topology.cluster import Cluster, Role

log = logging.getLogger("tfcluster")

#: How far apart the collective keys of two cluster strategies of one process start (TF's tests space theirs so).
COLLECTIVE_KEY_STRIDE = 100000
_built = itertools.count()

#: The strategies a TF 2 program builds for one process that become the cluster's on several trainers.
ONE_PROCESS = ("MirroredStrategy", "CentralStorageStrategy", "OneDeviceStrategy")


def trainers_spec(cluster: Cluster) -> Optional[dict]:
    """The trainers' part of ``cluster`` as TF's collective runtime takes it (``master`` is its ``chief``), or
    None when this task does not train with others (one trainer, or a ps, an evaluator, a job of no role)."""
    if cluster is None or cluster.task is None or not cluster.task.trains or cluster.num_replicas < 2:
        return None
    return {"chief" if job == "master" else job: list(addresses) for job, addresses in cluster.jobs.items()
            if job in ("chief", "master", "worker")}


def _local_gpus(devices) -> Optional[int]:
    """How many GPUs each trainer gives the strategy: ``devices``' GPUs when the program named devices, else all."""
    if devices is None:
        return None
    names = [devices] if isinstance(devices, str) else list(devices)
    return sum(1 for name in names if "gpu" in name.lower())


def _devices_here() -> dict:
    """``{"CPU": 1, "GPU": 2}``: this process's devices of each type, logical ones counted (a CPU split in N)."""
    import tensorflow as tf
    counts = {}
    for device in tf.config.list_physical_devices():
        logical = tf.config.get_logical_device_configuration(device)
        counts[device.device_type] = counts.get(device.device_type, 0) + (len(logical) if logical else 1)
    return counts


def check_devices(kind: str, devices) -> None:
    """A device name TF cannot parse is one line (StrategyArgumentError); a device this machine lacks, one warning.

    TF 2.21 raises a ValueError traceback at the first, and puts the second's replicas on the CPU without a
    word (soft placement), as TF 2.x did: a program written for GPUs still runs here, and says so.
    """
    if devices is None:
        return
    import tensorflow as tf
    names = [devices] if isinstance(devices, str) else list(devices)
    here, missing = _devices_here(), []
    for name in names:
        try:
            spec = tf.DeviceSpec.from_string(name)
        except ValueError as e:
            raise StrategyArgumentError(f"{kind}(devices={names}): {name!r} is not a device name "
                                        f"({str(e).rstrip('.')}); name devices as '/gpu:0', '/cpu:0'") from None
        if spec.device_type and (spec.device_index or 0) >= here.get(spec.device_type.upper(), 0):
            missing.append(name)
    if missing:
        have = ", ".join(f"{n} {t}" for t, n in sorted(here.items()))
        one = len(missing) == 1
        log.warning("%s(devices=%s): %s %s not on this machine (it has %s): TF places %s on the CPU", kind, names,
                    ", ".join(missing), "is" if one else "are", have, "that replica" if one else "those replicas")


def _communication(cross_device_ops):
    """TF's collective options for a one-process ``cross_device_ops`` (NCCL only where there are GPUs)."""
    import tensorflow as tf
    implementation = tf.distribute.experimental.CommunicationImplementation.AUTO
    if isinstance(cross_device_ops, tf.distribute.NcclAllReduce):
        if not tf.config.list_physical_devices("GPU"):
            raise StrategyArgumentError("cross_device_ops=NcclAllReduce() needs GPUs, and this machine has none: "
                                        "leave cross_device_ops out (ring all-reduce over the trainers)")
        implementation = tf.distribute.experimental.CommunicationImplementation.NCCL
    return tf.distribute.experimental.CommunicationOptions(implementation=implementation)


def multi_worker(kind: str, cluster: Cluster, devices=None, cross_device_ops=None):
    """TF's ``MultiWorkerMirroredStrategy`` over ``cluster``'s trainers, for a program that built ``kind``."""
    import tensorflow as tf
    from tensorflow.python.distribute.cluster_resolver import SimpleClusterResolver
    spec = trainers_spec(cluster)
    task = cluster.task
    resolver = SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief" if task.role is Role.CHIEF else task.job, task_id=task.index,
        num_accelerators={"GPU": gpus} if (gpus := _local_gpus(devices)) is not None else None, rpc_layer="grpc")
    unused = cluster.num_tasks("ps")
    log.info("%s on a cluster of %d trainers: one model over all of them (TF's MultiWorkerMirroredStrategy, "
             "gradients all-reduced)%s", kind, cluster.num_replicas,
             f"; the {unused} ps task(s) are unused (--ps 0 leaves them out)" if unused else "")
    # Each strategy of the process gets collective keys of its own: TF numbers every MultiWorkerMirroredStrategy's
    # from the same base, and a program that builds a second (TF's save-and-load tutorial loads its model in a
    # OneDeviceStrategy after training in a MirroredStrategy) then reuses the first's keys for other tensors:
    # "Collective instance 109 expected type 1 and data_type 9 but got ... data_type 1". Every trainer runs the
    # same lines, so the n-th strategy has the same keys on each.
    strategy = tf.distribute.MultiWorkerMirroredStrategy.__new__(tf.distribute.MultiWorkerMirroredStrategy)
    strategy._collective_key_base = COLLECTIVE_KEY_STRIDE * next(_built)
    strategy.__init__(cluster_resolver=resolver, communication_options=_communication(cross_device_ops))
    return strategy


def on_cluster(original, cluster: Optional[Cluster], kind: str, arguments):
    """``tf.distribute.<kind>`` whose instances are ``cluster``'s strategy on several trainers (see the module).

    ``arguments(*args, **kwargs)`` -> ``(devices, cross_device_ops)`` reads the
    program's arguments in ``kind``'s signature.
    """

    class SameAs(type(original)):
        """TF's own instances (made by TF, not through the public name) still pass tf-keras's isinstance checks."""

        def __instancecheck__(cls, obj):
            return isinstance(obj, original)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, original)

    class Strategy(original, metaclass=SameAs):
        def __new__(cls, *args, **kwargs):
            devices, cross_device_ops = arguments(*args, **kwargs)
            check_devices(kind, devices)
            if trainers_spec(cluster) is None:
                return super().__new__(cls)
            return multi_worker(kind, cluster, devices, cross_device_ops)

    Strategy.__name__ = Strategy.__qualname__ = kind
    Strategy.__module__ = original.__module__
    Strategy.__doc__ = original.__doc__
    Strategy.__wrapped__ = original     # the registry's "TF's own" (and inspect.signature shows TF's)
    return Strategy


def mirrored_arguments(devices=None, cross_device_ops=None):
    """``MirroredStrategy(devices, cross_device_ops)``'s arguments."""
    return devices, cross_device_ops


def central_storage_arguments(compute_devices=None, parameter_device=None):
    """``CentralStorageStrategy(compute_devices, parameter_device)``: its compute devices are the replicas."""
    return compute_devices, None


def one_device_arguments(device):
    """``OneDeviceStrategy(device)``: one replica per trainer, on that kind of device."""
    return [device], None


# ------------------------------------------------------------------ the patches
_DISTRIBUTE = "tensorflow._api.v2.distribute"
_COMPAT = "tensorflow._api.v2.compat.v2.distribute"
_CLUSTER_WHY = "on a cluster of several trainers, the program's one-process strategy is one model over all of them"
for _kind, _where, _arguments in (("MirroredStrategy", "", mirrored_arguments),
                                  ("CentralStorageStrategy", ".experimental", central_storage_arguments),
                                  ("OneDeviceStrategy", "", one_device_arguments)):
    register(Patch(f"tf2.cluster_{_kind}", f"{_DISTRIBUTE}{_where}:{_kind}", _CLUSTER_WHY,
                   lambda original, cluster, kind=_kind, arguments=_arguments: on_cluster(original, cluster, kind,
                                                                                            arguments),
                   "TF2 mode", also=(f"{_COMPAT}{_where}:{_kind}",)))

_said_private = threading.Event()


def _has_strategy() -> bool:
    import tensorflow as tf
    return tf.distribute.has_strategy()


def said_private_copy(original, cluster):
    """An optimizer's ``apply_gradients`` that, on ``cluster`` of several trainers with no strategy in scope, says
    once that this trainer trains a private copy of its model (a program that never built a strategy)."""
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        if not _said_private.is_set() and not _has_strategy():
            _said_private.set()             # said now, or never to be said: one process, or a lone trainer
            if trainers_spec(cluster) is not None:
                log.warning("%s trains a private copy of its model: no tf.distribute strategy holds it on this "
                            "cluster of %d trainers (build it in tf.distribute.MirroredStrategy().scope() to train "
                            "one model over all of them; docs/tf2.md)", cluster.task, cluster.num_replicas)
        return original(self, grads_and_vars, *args, **kwargs)
    return apply_gradients


_PRIVATE_WHY = "a trainer that trains a private copy of its model on a cluster says so once, at its first update"
register(Patch("tf2.private_copy", "tf_keras.src.optimizers.optimizer:_BaseOptimizer.apply_gradients", _PRIVATE_WHY,
               said_private_copy, "TF2 mode, where tf-keras is installed", params=("self", "grads_and_vars"),
               optional=True))
register(Patch("tf2.private_copy_v2", "tf_keras.src.optimizers.legacy.optimizer_v2:OptimizerV2.apply_gradients",
               _PRIVATE_WHY, said_private_copy, "TF2 mode, where tf-keras is installed",
               params=("self", "grads_and_vars"), optional=True))
register(Patch("tf2.private_copy_keras3", "keras.src.optimizers.base_optimizer:BaseOptimizer.apply_gradients",
               _PRIVATE_WHY, said_private_copy, "TF2 mode, with Keras 3", params=("self", "grads_and_vars"),
               optional=True))

#: The patches of this module TF2 mode installs, each given the process's cluster (or None).
PATCHES = ("tf2.cluster_MirroredStrategy", "tf2.cluster_CentralStorageStrategy", "tf2.cluster_OneDeviceStrategy",
           "tf2.private_copy", "tf2.private_copy_v2", "tf2.private_copy_keras3")
