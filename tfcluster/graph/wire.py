"""Fewer bytes between the ps and the workers: weights and gradients travel in 16 bits, the ps keeps float32.

Parameter-server training of a small model is bound by the bytes TF's gRPC
runtime moves: a traced step of the bench MLP spends about 3-5 ms receiving
weights on the worker and 3-4 ms receiving gradients on the ps, against 2.7 ms
of matrix work (``scripts/bench/profile_step.py``; the README's Benchmarks).
With a 16-bit wire each crossing carries half the bytes.

How (``wire="bfloat16"`` or ``"float16"`` on the ps strategies):

- **Weights.** Every trainable float32 variable created in the strategy's
  scope on another task (a ps) gets, as it is created, a read cast to 16 bits
  *on the variable's device* and back to float32 on the worker (in bfloat16,
  by the crossing that carries it: once for each pack of a step's reads,
  graph/crossing.py). It becomes the
  variable's cached value, the tensor ``ResourceVariable.value()`` returns (the
  mechanism of ``caching_device``), so every op that turns the variable into a
  tensor reads through the wire: ``tf.matmul(x, v)``, ``tf.compat.v1.layers``
  and tf-keras graph-mode layers alike. The hook is a variable creator, which
  sees variables made by ``get_variable``, by the layers and by ``tf.Variable``
  (a custom getter would see ``get_variable``'s only).
- **Gradients.** The casts pass gradients straight through (no gradient op is
  made for them), so a variable's gradient is computed on the worker in
  float32; :meth:`Wire.gradients` casts it to 16 bits there and back to
  float32 next to the variable, before the optimizer or a sync slot sees it.
- **The ps** keeps, updates and checkpoints float32: checkpoints read the
  variable itself, never the cached value.

float16 carries 3 more bits of mantissa than bfloat16 but 5 fewer of
exponent: each tensor is scaled by a power of two on the sending side (exact to
undo) so that its largest magnitude lands below 2^15, far from float16's
65504, and the scale travels along as one float32.

Not covered, and said in one line when the graph is built: reference
variables (``use_resource=False``, which ``disable_v2_behavior`` makes the
default) and trainable variables of other dtypes travel as they are. Reads
that bypass ``value()`` travel in float32 too: an explicit ``read_value()``,
and other sparse reads than ``embedding_lookup``'s.

- **Rows.** An ``embedding_lookup`` of a table on the ps reads only its rows
  there (graph/sparse.py); under bfloat16 each part's gathered rows travel
  in it (:func:`rows_wire`), as do their gradients, cast once per pack.
  Under float16 rows travel as float32: one scale per part cannot ride along
  TF's lookup.

TensorFlow is imported lazily, so importing this module stays cheap.
"""

import logging

from ..core import environment
from ..core.checks import choice_from
from . import crossing, gate

log = logging.getLogger("tfcluster")

#: What ``wire=`` takes: float32 (off: what the variables hold), or a 16-bit type.
WIRES = ("float32", "bfloat16", "float16")

#: Environment variable giving ``wire`` when the strategy names none (``tfcluster local --wire``).
WIRE_ENV = environment.WIRE.name

#: The gradient of every op between a variable and its wire copy: the incoming gradient, unchanged.
_PASS = "TfclusterWirePass"

#: float16 only: the largest magnitude of a scaled tensor is below 2**(_TOP + 2) (a log2 rounded either way).
_TOP = 13


def resolve_wire(wire=None) -> str:
    """``wire`` checked, or ``TFCLUSTER_WIRE`` when it is None, else ``"float32"``."""
    return choice_from("wire", wire, environment.WIRE, WIRES, "float32")


def _register_pass_gradient():
    import tensorflow as tf
    try:
        tf.RegisterGradient(_PASS)(lambda op, grad: [grad] + [None] * (len(op.inputs) - 1))
    except KeyError:  # registered already (one registry per process)
        pass


def _pass_gradients():
    """A scope in which the wire's casts and scalings hand their gradient straight through."""
    import tensorflow as tf
    _register_pass_gradient()
    return tf.compat.v1.get_default_graph().gradient_override_map(
        {"Cast": _PASS, "Mul": _PASS, "RealDiv": _PASS})


def _scale_of(x):
    """float16: a power of two that brings ``x``'s largest magnitude to [2^12, 2^15) (no gradient)."""
    import math

    import tensorflow as tf
    m = tf.reduce_max(tf.abs(x))
    e = float(_TOP) - tf.floor(tf.math.log(tf.maximum(m, 1e-30)) / math.log(2.0))
    return tf.stop_gradient(tf.pow(2.0, tf.clip_by_value(e, -60.0, 60.0)))


def pack(x, wire: str):
    """``(16-bit tensor, float32 scale or None)`` of float32 ``x``: the sending side of the wire."""
    import tensorflow as tf
    if wire == "bfloat16":
        with _pass_gradients():
            return tf.cast(x, tf.bfloat16), None
    scale = _scale_of(x)
    with _pass_gradients():
        return tf.cast(x * scale, tf.float16), scale


def unpack(packed, scale):
    """The float32 value of :func:`pack`'s output: the receiving side of the wire."""
    import tensorflow as tf
    with _pass_gradients():
        y = tf.cast(packed, tf.float32)
        return y if scale is None else y / scale


#: A variable bigger than this is read whole by itself, outside the step's packs: a table (its lookups read rows),
#: or a weight so big that one transfer's overhead is nothing beside its bytes.
ALONE_BYTES = 4 << 20


def _nbytes(v) -> int:
    shape = v.shape
    return shape.num_elements() * v.dtype.base_dtype.size if shape.is_fully_defined() else ALONE_BYTES + 1


def gradient_way(wire: str):
    """``(narrow, widen)``: how a gradient of what crossed in ``wire`` crosses back (graph/crossing.py): cast
    (and, in float16, scaled) where it was made, float32 again where it arrives."""
    def narrow(grad):
        packed, scale = pack(grad, wire)
        return [packed] + ([] if scale is None else [scale])

    def widen(received):
        return unpack(received[0], received[1] if len(received) > 1 else None)
    return narrow, widen


def _task_of(device: str):
    return gate.task_of_device(device)


def rows_wire(parts) -> "str | None":
    """The 16-bit type a table's looked-up rows travel in: bfloat16 when every part is read through that wire."""
    return "bfloat16" if parts and all(getattr(p, "_tfcluster_wire", None) == "bfloat16" for p in parts) else None


class Wire:
    """One worker's wire: which variables are read through it, and how its gradients travel.

    ``dtype``: one of :data:`WIRES` (float32 does nothing). ``receiver``: the
    worker's device that receives weights and sends gradients.
    """

    def __init__(self, dtype: str, receiver: str):
        self.dtype = resolve_wire(dtype)
        self.receiver = receiver
        self.wired = []        # variables read through the wire
        self.skipped = []      # (variable name, why it travels as it is)

    @property
    def on(self) -> bool:
        """True when weights and gradients travel in 16 bits."""
        return self.dtype != "float32"

    def creator(self):
        """A ``variable_creator_scope`` function that reads each new remote trainable variable through the wire."""
        def create(next_creator, **kwargs):
            v = next_creator(**kwargs)
            self._read_through_wire(v)
            return v
        return create

    def _read_through_wire(self, v):
        import tensorflow as tf
        tf1 = tf.compat.v1
        if not v.trainable or _task_of(v.device) == _task_of(self.receiver) or _task_of(v.device)[0] is None:
            return
        name = v.op.name
        element = getattr(v, "_graph_element", None)
        if not hasattr(v, "_cached_value") or element is None:
            if self.on:
                self.skipped.append((name, "a reference variable (use_resource=False)"))
            return
        graph = tf1.get_default_graph()
        narrow = self.on and v.dtype.base_dtype == tf.float32
        if self.on and not narrow:
            self.skipped.append((name, f"{v.dtype.base_dtype.name}, not float32"))
        # The sender's cast sits next to the variable; the colocation and device stacks of the
        # caller (a tower, the strategy's setter) must not move it (as TF's own caching_device does).
        # Every weight's read is one crossing to the worker (graph/crossing.py: a step's reads travel packed).
        # A big variable's whole read (a table's, which lookups read by rows) travels alone, never in a pack.
        table = _nbytes(v) > ALONE_BYTES
        with graph.colocate_with(None, ignore_existing=True), tf1.name_scope(f"{name}/wire/"):
            if not narrow:
                if not table:
                    v._cached_value = crossing.cross(element, self.receiver)
                return
            if self.dtype in crossing.WIRES and not table:
                # The crossing casts it, once for its whole pack (graph/crossing.py), and its gradient back.
                v._cached_value = crossing.cross(element, self.receiver, wire=self.dtype)
            else:
                with tf1.device(v.device):
                    packed, scale = pack(element, self.dtype)
                with tf1.device(self.receiver):
                    read = packed if table else crossing.cross(packed, self.receiver,
                                                               gradient=gradient_way(self.dtype))
                    v._cached_value = unpack(read, None if scale is None or table else crossing.cross(scale,
                                                                                                      self.receiver))
        v._tfcluster_wire = self.dtype
        self.wired.append(v)

    def gradients(self, grads_and_vars):
        """``grads_and_vars`` with each wired variable's gradient cast to 16 bits here and back next to it."""
        import tensorflow as tf
        tf1 = tf.compat.v1
        if not self.on:
            return list(grads_and_vars)
        wired = {id(v) for v in self.wired}
        graph = tf1.get_default_graph()
        out = []
        for g, v in grads_and_vars:
            values = g.values if isinstance(g, tf.IndexedSlices) else g
            # A gradient made next to its variable crossed already (a lookup's rows, graph/crossing.py).
            if g is None or id(v) not in wired or _task_of(values.device) == _task_of(v.device):
                out.append((g, v))
                continue
            with tf1.name_scope(f"{v.op.name}/wire_gradient/"):
                with tf1.device(self.receiver):
                    packed, scale = pack(values, self.dtype)
                with graph.colocate_with(v):
                    back = unpack(packed, scale)
            out.append((tf.IndexedSlices(back, g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices)
                        else back, v))
        return out

    def describe(self) -> str:
        """e.g. ``weights and gradients travel as bfloat16 (4 variables, 1.6 MB on the ps as float32)``."""
        if not self.on:
            return "weights and gradients travel as float32"
        nbytes = sum((v.shape.num_elements() or 0) * 4 for v in self.wired)
        return (f"weights and gradients travel as {self.dtype} ({len(self.wired)} variable(s), "
                f"{nbytes / 2 ** 20:.1f} MB on the ps as float32)")

    def report(self, where: str):
        """Log, once per build, what travels in 16 bits and, in one line, what cannot."""
        if not self.on:
            return
        log.info("%s: %s", where, self.describe())
        if self.skipped:
            names = ", ".join(f"{n} ({why})" for n, why in self.skipped[:4])
            more = f" and {len(self.skipped) - 4} more" if len(self.skipped) > 4 else ""
            log.warning("%s: wire %s cannot cover %d variable(s), which travel as they are: %s%s", where,
                        self.dtype, len(self.skipped), names, more)
