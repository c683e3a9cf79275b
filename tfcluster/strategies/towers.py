"""Towers: one replica of the model per local device, in one graph (every strategy's ``towers=N``, README "Training").

This is the multi-GPU tower pattern of the TF1 tutorials, shared by every
strategy (``towers=`` on any of them). Each tower calls ``model_fn`` on its
own per-replica batch, on its own device. Its loss is scaled to the global
batch (per-replica batch x every replica in sync), so the towers' gradients
are *summed*, which gives the gradient of the global batch's mean loss; the
strategy then applies that sum once, or combines it across workers first.

Storage (``Towers(storage=...)``): ``"shared"`` towers read each trainable
variable where the strategy put it (the ps tasks, the host CPU), once per step
into the worker's CPU (``caching_device``), and their gradients are summed on
the worker before they leave it (the "replicated + parameter server" layout).
``"mirrored"`` towers: the first tower's device holds the variables, every
other tower a copy (local variables, never checkpointed), refreshed after each
update in the same step (:meth:`TowerBuild.refresh`).

Devices: ``None`` takes every GPU, or one CPU tower without GPUs; ``N`` takes
N GPUs when the machine has them, else N *virtual* CPU devices, which
tfcluster creates through ``ConfigProto.device_count`` (TF 2.21 honours it in
graph mode for a local session and for a ``tf.train.Server``); a list names
them (``["/gpu:0", "/gpu:1"]``). An op without a kernel on its tower's device
(a string op on a GPU) falls back through soft placement, which tfcluster
always turns on.

Towers share variables by name, as in the TF1 tutorials: towers after the
first run ``model_fn`` under ``variable_scope(reuse=True)``, so ``model_fn``
must create its trainable variables with ``tf.compat.v1.get_variable`` or
``tf.compat.v1.layers`` with fixed names. Batch-norm style update ops and the
regularisation loss are taken from the first tower, once per worker; batch
norm in training normalises each tower's own batch (it is not synchronised
across towers, as in TensorFlow's MirroredStrategy), so a batch-norm model is
not the same computation as one device on the global batch.
"""

import contextlib
import dataclasses
import logging
import re

from ..core.errors import ModelFnError, SpecError
from ..graph.model import Mode, call_model_fn, make_optimizer, metric_updates, replica_loss
from ..graph.placement import PS_OPS, REPLICA_COLLECTION

log = logging.getLogger("tfcluster")

STORAGES = ("shared", "mirrored")


def _normalise_device(text) -> str:
    """``"gpu:1"``, ``"/GPU:1"``, ``"/device:GPU:1"`` -> ``"/device:GPU:1"``; refuses task parts."""
    import tensorflow as tf
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"tower device {text!r} is not a device name like '/gpu:0' or '/cpu:1'")
    raw = text.strip()
    short = re.fullmatch(r"/?(?:device:)?([A-Za-z_]+):(\d+)", raw)
    if short:  # DeviceSpec knows '/cpu:0' and '/gpu:0' only, not '/xla_cpu:0'
        raw = f"/device:{short.group(1).upper()}:{short.group(2)}"
    if not raw.startswith("/"):
        raw = "/" + raw
    try:
        spec = tf.DeviceSpec.from_string(raw)
    except ValueError:
        raise SpecError(f"tower device {text!r} is not a device name like '/gpu:0' or '/cpu:1'") from None
    if spec.job is not None or spec.task is not None or spec.replica is not None:
        raise SpecError(f"tower device {text!r} names a job or task; tower devices are local to the worker "
                        "(the strategy adds the worker's task)")
    if spec.device_type is None:
        raise SpecError(f"tower device {text!r} names no device type; use e.g. '/gpu:0' or '/cpu:1'")
    return tf.DeviceSpec(device_type=spec.device_type.upper(), device_index=spec.device_index or 0).to_string()


def _gpu_count() -> int:
    import tensorflow as tf
    return len(tf.config.list_physical_devices("GPU"))


class Towers:
    """The local devices a worker's replicas run on, and how the replicas are built.

    ``devices`` (a strategy's ``towers=``): None (every GPU, else one CPU
    tower), N (N GPUs if the machine has N, else N virtual CPU devices) or a
    list of device names.
    ``storage``: ``"shared"`` (every tower reads the variables where the
    strategy put them, cached once per step on the host) or ``"mirrored"``
    (the first tower holds them, the others hold copies).
    """

    def __init__(self, devices=None, storage: str = "shared"):
        if storage not in STORAGES:
            raise SpecError(f"tower storage must be one of {', '.join(STORAGES)}, got {storage!r}")
        if isinstance(devices, bool) or not (devices is None or isinstance(devices, (int, list, tuple))):
            raise SpecError(f"towers must be None, a number of devices or a list of device names, got {devices!r}")
        if isinstance(devices, int) and devices < 1:
            raise SpecError(f"towers must be at least 1, got {devices}")
        if isinstance(devices, (list, tuple)) and not devices:
            raise SpecError("towers is an empty list; name at least one device")
        self.spec = devices
        self.storage = storage
        self._local = None

    # -------------------------------------------------------------- devices
    @property
    def local_devices(self) -> list:
        """The towers' devices inside one worker, e.g. ``["/device:CPU:0", "/device:CPU:1"]``."""
        if self._local is None:
            self._local = self._resolve()
        return list(self._local)

    def _resolve(self) -> list:
        spec = self.spec
        if isinstance(spec, (list, tuple)):
            out = [_normalise_device(d) for d in spec]
            if len(set(out)) != len(out):
                raise SpecError(f"devices {list(spec)} name the same device twice")
            return out
        gpus = _gpu_count()
        if spec is None:
            return [f"/device:GPU:{i}" for i in range(gpus)] or ["/device:CPU:0"]
        if gpus >= spec:
            return [f"/device:GPU:{i}" for i in range(spec)]
        if gpus:
            log.warning("%d tower(s) asked for but only %d GPU(s) present; using %d virtual CPU devices",
                        spec, gpus, spec)
        return [f"/device:CPU:{i}" for i in range(spec)]

    @property
    def count(self) -> int:
        """Towers per worker."""
        if isinstance(self.spec, int) and not isinstance(self.spec, bool):
            return self.spec
        return len(self.local_devices)

    @property
    def cpu_devices_needed(self) -> int:
        """How many CPU devices the process must have (``device_count['CPU']``)."""
        import tensorflow as tf
        indexes = [tf.DeviceSpec.from_string(d).device_index for d in self.local_devices
                   if tf.DeviceSpec.from_string(d).device_type == "CPU"]
        return max(indexes) + 1 if indexes else 1

    @property
    def virtual(self) -> bool:
        """True when some towers are CPU devices beyond the one a process has by default."""
        return self.cpu_devices_needed > 1

    def configure(self, config):
        """Give the process enough (virtual) CPU devices for the towers; returns ``config``."""
        need = self.cpu_devices_needed
        if need > config.device_count.get("CPU", 1):
            config.device_count["CPU"] = need
        return config

    def placed(self, strategy) -> list:
        """The towers' full device names on ``strategy``'s worker."""
        prefix = strategy.worker_device or ""
        return [prefix + d for d in self.local_devices]

    @staticmethod
    def host(strategy) -> str:
        """The worker's CPU: input pipeline, cached variable reads, shared-storage gradient sums."""
        return (strategy.worker_device or "") + "/device:CPU:0"

    def describe(self) -> str:
        """e.g. ``2 towers on /device:CPU:0, /device:CPU:1 (virtual CPU devices)``."""
        kind = " (virtual CPU devices)" if self.virtual else ""
        return f"{self.count} tower(s) on {', '.join(self.local_devices)}{kind}"

    # -------------------------------------------------------------- building
    def build(self, strategy, model_fn, next_batch, optimizer, per_replica_batch) -> "TowerBuild":
        """Build every tower under the current (strategy) scope and sum their gradients."""
        return _TowerBuilder(self, strategy, model_fn, next_batch, optimizer, per_replica_batch).build()


@dataclasses.dataclass
class TowerBuild:
    """What building the towers of one worker gives: the summed gradients and what goes with them.

    ``grads`` are ``(sum over towers, primary variable)`` pairs; ``losses``
    are every tower's scaled loss (an update should run after them);
    ``mirrors`` maps each primary trainable variable to its copies on the
    other towers (mirrored storage only).
    """

    global_step: object
    optimizer: object
    model: object
    mean: object
    grads: list
    update_ops: list
    losses: list
    mirrors: list = dataclasses.field(default_factory=list)

    def as_tuple(self):
        """``(global_step, optimizer, model, mean_loss, grads, update_ops)`` as ``build_single_replica`` gives."""
        return self.global_step, self.optimizer, self.model, self.mean, self.grads, self.update_ops

    def refresh(self, deps):
        """An op that copies every primary variable to its tower copies, after ``deps`` (the update)."""
        import tensorflow as tf
        tf1 = tf.compat.v1
        copies = []
        for v, mirrors in self.mirrors:
            with tf.control_dependencies(list(deps)):
                value = v.read_value()
            for m in mirrors:
                with tf1.device(m.device):
                    copies.append(m.assign(value, read_value=False))
        return tf.group(*copies, name="tfcluster_refresh_towers")


def _consumes_resource(op) -> bool:
    import tensorflow as tf
    return any(t.dtype == tf.resource for t in op.inputs)


def tower_device_fn(device: str, place_variables: bool):
    """A device function: a tower's compute goes to ``device``; variables to the outer scope (or here).

    Variable ops and ops on a resource (reads, assigns) are left to the
    scopes outside the tower (the strategy's storage), unless
    ``place_variables`` puts the variables on this tower's device. An
    explicit device inside ``model_fn`` (``with tf.device('/cpu:0')``) wins.
    """
    import tensorflow as tf
    tower = tf.DeviceSpec.from_string(device)

    def fn(op):
        current = tf.DeviceSpec.from_string(op.device or "")
        if op.type in PS_OPS:
            return tower.make_merged_spec(current).to_string() if place_variables else op.device
        if _consumes_resource(op):
            return op.device
        return tower.make_merged_spec(current).to_string()
    return fn


def sum_gradients(grads):
    """Sum one variable's gradients from several towers (dense, or IndexedSlices concatenated)."""
    import tensorflow as tf
    if len(grads) == 1:
        return grads[0]
    if all(isinstance(g, tf.IndexedSlices) for g in grads):
        return tf.IndexedSlices(tf.concat([g.values for g in grads], 0), tf.concat([g.indices for g in grads], 0),
                                grads[0].dense_shape)
    return tf.add_n([tf.convert_to_tensor(g) for g in grads])


class _TowerBuilder:
    def __init__(self, towers: Towers, strategy, model_fn, next_batch, optimizer, per_replica_batch):
        import tensorflow as tf
        self.tf, self.tf1 = tf, tf.compat.v1
        self.towers, self.strategy = towers, strategy
        self.model_fn, self.next_batch = model_fn, next_batch
        self.optimizer, self.per_replica_batch = optimizer, per_replica_batch
        self.devices = towers.placed(strategy)
        self.host = towers.host(strategy)
        self.mirrored = towers.storage == "mirrored"

    def _first_creator(self):
        """Tower 0 creates the variables; shared storage caches each trainable one on the host."""
        tf1 = self.tf1
        host = self.host

        def creator(next_creator, **kwargs):
            collections = kwargs.get("collections") or []
            trainable = kwargs.get("trainable")
            local = tf1.GraphKeys.LOCAL_VARIABLES in collections
            # Only trainable variables are cached: the optimizer alone writes
            # them, after the step's reads. A metric or batch-norm statistic
            # read after its own update must not see a cached old value.
            if (not self.mirrored and trainable is not False and not local
                    and kwargs.get("caching_device") is None):
                kwargs["caching_device"] = host
            return next_creator(**kwargs)
        return creator

    def _later_creator(self, k):
        """Towers after the first share tower 0's variables; a new trainable one cannot be shared."""
        tf1 = self.tf1

        def creator(next_creator, **kwargs):
            collections = kwargs.get("collections") or []
            if kwargs.get("trainable") is not False and tf1.GraphKeys.LOCAL_VARIABLES not in collections:
                raise ModelFnError(
                    f"tower {k} created a new trainable variable ({kwargs.get('name') or 'unnamed'}) instead of "
                    "sharing tower 0's: towers share variables by name, so create them with "
                    "tf.compat.v1.get_variable or tf.compat.v1.layers with fixed names, not tf.Variable")
            return next_creator(**kwargs)
        return creator

    def _mirror_getter(self, k):
        def getter(getter, *args, **kwargs):  # TF calls it with keywords, the first named 'getter'
            v = getter(*args, **kwargs)
            copies = self.mirror_of.get(id(v))
            return v if copies is None else copies[k]
        return getter

    def _make_mirrors(self, trainables):
        """A copy of each trainable variable on every other tower (local, refreshed after each update)."""
        tf1 = self.tf1
        self.mirror_of = {}
        pairs = []
        graph = tf1.get_default_graph()
        with graph.name_scope(None), tf1.device(None):
            for v in trainables:
                copies = [None]
                for k, device in enumerate(self.devices[1:], start=1):
                    with tf1.device(device):
                        copies.append(tf1.Variable(
                            lambda v=v: v.read_value(), trainable=False, use_resource=True,
                            name=f"tower_{k}/{v.op.name}", dtype=v.dtype.base_dtype,
                            collections=[tf1.GraphKeys.LOCAL_VARIABLES, REPLICA_COLLECTION]))
                self.mirror_of[id(v)] = copies
                pairs.append((v, copies[1:]))
        return pairs

    def _tower(self, k, features, labels, trainables=None):
        """Build tower k: (model output, scaled loss, mean loss, gradients, update ops, trainable variables)."""
        tf, tf1 = self.tf, self.tf1
        n = len(self.devices)
        ctx = self.strategy.replica_context(self.per_replica_batch, tower=k)
        with contextlib.ExitStack() as stack:
            if k == 0:
                stack.enter_context(tf1.variable_creator_scope(self._first_creator()))
            else:
                getter = self._mirror_getter(k) if self.mirrored else None
                stack.enter_context(tf1.variable_scope(tf1.get_variable_scope(), reuse=True, custom_getter=getter,
                                                       auxiliary_name_scope=False))
                stack.enter_context(tf1.name_scope(f"tower_{k}"))
                stack.enter_context(tf1.variable_creator_scope(self._later_creator(k)))
            stack.enter_context(tf1.device(tower_device_fn(self.devices[k], self.mirrored and k == 0)))
            try:
                out = call_model_fn(self.model_fn, features, labels, Mode.TRAIN)
            except ValueError as e:
                if k and "does not exist" in str(e):
                    raise ModelFnError(
                        f"tower {k} asked for a variable tower 0 did not create ({str(e).splitlines()[0]}); "
                        "towers share variables by name: give layers fixed names") from None
                raise
            # Update ops (batch-norm statistics, and the metrics fit reports) run once per step: tower 0's.
            updates = list(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)) + metric_updates(out) if k == 0 else []
            if k == 0:
                # Regularisation counts once per worker: tower 0 carries it for all n towers.
                reg = out.regularization_loss
                if reg is None:
                    reg = tf1.losses.get_regularization_loss()
                out = dataclasses.replace(out, regularization_loss=tf.cast(reg, tf.float32) * float(n))
                trainables = list(tf1.trainable_variables())
                var_list = trainables
            else:
                out = dataclasses.replace(out, regularization_loss=tf.constant(0.0))
                var_list = [self.mirror_of[id(v)][k] for v in trainables] if self.mirrored else trainables
            scaled, mean = replica_loss(out, ctx)
            if not var_list:
                raise ModelFnError("the loss depends on no trainable variable; nothing to train")
            pairs = self.opt.compute_gradients(scaled, var_list=var_list, colocate_gradients_with_ops=True)
        return out, scaled, mean, [g for g, _ in pairs], updates, trainables

    def build(self) -> TowerBuild:
        tf, tf1 = self.tf, self.tf1
        global_step = tf1.train.get_or_create_global_step()
        self.opt = make_optimizer(self.optimizer)
        batches = [self.next_batch() for _ in self.devices]
        out0, scaled, mean, grads0, updates, trainables = self._tower(0, *batches[0])
        mirrors = self._make_mirrors(trainables) if self.mirrored else []
        losses, means, tower_grads = [scaled], [mean], [grads0]
        for k in range(1, len(self.devices)):
            _, scaled, mean, grads, _, _ = self._tower(k, *batches[k], trainables=trainables)
            losses.append(scaled)
            means.append(mean)
            tower_grads.append(grads)
        reduce_device = self.devices[0] if self.mirrored else self.host
        summed = []
        with tf1.name_scope("tfcluster_towers"):
            for i, v in enumerate(trainables):
                gs = [g[i] for g in tower_grads if g[i] is not None]
                if not gs:
                    continue
                with tf1.device(reduce_device):
                    summed.append((sum_gradients(gs), v))
            if not summed:
                raise ModelFnError("the loss depends on no trainable variable; nothing to train")
            with tf1.device(self.host):
                mean = tf.add_n(means) / float(len(means))
        return TowerBuild(global_step, self.opt, out0, mean, summed, list(updates), losses, mirrors)


