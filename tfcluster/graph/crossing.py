"""Tensors that cross between two devices in a step travel together: one transfer for them all, not one each.

TF's runtime moves every tensor one task reads from another as a ``RecvTensor``
call of its own, and on a busy machine each call costs far more than its bytes
(gRPC's calls, threads handing work to each other): the bench's click-through
step moved 15 tensors each way between a worker and the ps, the rows of each
table part, the ids each part was asked for, every dense weight and every
gradient (docs/embeddings.md, C9).

:func:`cross` marks the point where a tensor made on one device is read on
another: an ``Identity`` on the reading device, whose gradient crosses back the
same way. Until :func:`pack` runs it is just that, a transfer of its own.
:func:`pack` then puts the crossings of a graph that can travel together into
one tensor: flattened and concatenated on the sending device, split and
reshaped on the receiving one, each crossing's ``Identity`` reading its piece.
Gradients pass through concatenation and split, so a packed step's gradients
travel packed too. It runs by itself before a graph's first step
(``BaseSession._extend_graph``) and before ``Graph.finalize`` (the patches
``crossing.pack_before_run`` and ``crossing.pack_before_finalize``,
docs/patches.md), so every front end gets it: fit, the Estimator, Keras, and
the sessions of a TF1 program.

A crossing may name a 16-bit ``wire`` (graph/wire.py's bfloat16): it is cast
to it on the sending device and back on the reading one, and its gradient
crosses back the same way. A pack of such crossings is cast once, not once a
piece: a 52-table step cast each table's rows and gradients on its ps, 115
casts a step on two ps, and ran at 0.7 of the step cast once a pack
(docs/embeddings.md). A crossing inside a ``while`` or ``cond`` travels in its
own type.

Crossings travel together when nothing can tell: the same sending and
receiving device and dtype, the same *level* (how many crossings lie before
them on any path: the ids a step sends the ps are level 0, the rows that come
back 1, their gradients 2, so no pack waits for its own result), and the same
*sources*, the placeholders and stateful ops (an iterator's ``get_next``, a
random op, a queue) they depend on, so that a step that needs one of them runs
nothing the others would have made it run: a weight's read is never packed with
rows, which read the input. Variable reads are not sources. Crossings inside a
``while`` or ``cond``, and crossings nothing reads yet, travel as they are.

TensorFlow is imported lazily, so importing this module stays cheap.
"""

import contextlib
import math
import threading
from dataclasses import dataclass, field

from . import gate
from .gate import PLACEHOLDERS, in_control_flow as _in_control_flow, is_source

#: The gradient of a crossing: the incoming gradient crossing back to where the tensor was made.
_GRADIENT = "TfclusterCrossing"

#: What packs: fixed-size numbers (strings, resources and variants cannot be concatenated into one buffer).
_PACKABLE = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
             "uint16", "uint32", "uint64")
#: What can carry its pieces' sizes in front of them (a pack of other types needs every size known at its end).
_SIZED = ("int32", "int64")


@dataclass(eq=False)
class Crossing:
    """One tensor read on another device: ``read`` (the Identity there) reads ``sent`` from where it was made."""

    sent: object                    #: the tensor, on its own device
    read: object                    #: the Identity on the reading device
    shape: object = None            #: its shape as the reader can compute it, where not fully known statically
    gradient: object = None         #: ``(narrow, widen)`` of its gradient's way back, or None: as it is
    kind: str = ""                  #: what crosses: "rows" of a lookup (graph/prefetch.py stages them), or ""
    sent_shape: object = None       #: its shape as the sending side can compute it (its gradient's way back)
    wire: str = ""                  #: the 16-bit type it travels in ("bfloat16"), read in its own; "": as it is
    packed: bool = False

    def shape_tensors(self) -> list:
        """The tensors :attr:`shape` is computed from (a shape tensor, or a row count beside fixed dims)."""
        return [s for s in _as_list(self.shape) if hasattr(s, "op")]


def _as_list(shape) -> list:
    if shape is None:
        return []
    return list(shape) if isinstance(shape, (list, tuple)) else [shape]


@dataclass
class _State:
    crossings: list = field(default_factory=list)
    by_op: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    packs: int = 0


_state = gate.PerGraph(_State)


def crossings(graph) -> list:
    """The graph's crossings (packed or not), in the order they were made."""
    return list(_state(graph).crossings)


def _tf():
    import tensorflow as tf
    return tf


def _register_gradient():
    tf = _tf()
    try:
        tf.RegisterGradient(_GRADIENT)(_crossing_gradient)
    except KeyError:  # registered already (one registry per process)
        pass


#: What a crossing's ``wire`` may be: a 16-bit type that needs no scale (float16 does: graph/wire.py casts it).
WIRES = ("", "bfloat16")


def cross(tensor, device: str, shape=None, gradient=None, kind: str = "", sent_shape=None, wire: str = ""):
    """``tensor`` as read on ``device`` (a device name; "" for the current device scope), through one crossing.

    ``shape``: the tensor's shape computed on the reading side, where the static shape is not fully known (a
    pack splits its pieces by it): a shape tensor, or a list of a row count (a scalar tensor) and the fixed
    sizes of the other dimensions, which splits and reshapes a pack without shape arithmetic. Without one,
    only integer tensors of unknown size pack (they carry their sizes). ``sent_shape``: the same, computed on
    the sending side, for the gradient's way back (else that side reads the tensor's shape). ``wire``: a type of
    :data:`WIRES` the float32 ``tensor`` travels in (cast by :func:`pack`, once per pack); its gradient travels
    back in it too. Where ``tensor`` already lives on ``device``'s task and device, it is returned as it is.
    """
    tf = _tf()
    tf1 = tf.compat.v1
    graph = tensor.graph
    _register_gradient()
    # An explicit device leaves the caller's colocation (a part's, say) behind; "" keeps the caller's scope whole
    # (TF's colocate_with(None) also clears the device stack).
    place = contextlib.ExitStack()
    if device:
        place.enter_context(graph.colocate_with(None, ignore_existing=True))
        place.enter_context(tf1.device(device))
    with place, graph.gradient_override_map({"Identity": _GRADIENT}):
        read = tf.identity(tensor, name="crossing")
    if _same_device(tensor.op.device, read.op.device):
        return read
    if wire not in WIRES:
        raise ValueError(f"a crossing's wire must be one of {WIRES}, got {wire!r}")
    if graph._get_control_flow_context() is not None or _in_control_flow(tensor.op):   # noqa: SLF001
        wire = ""       # no pack sees it, and a cast put between a loop and its input would leave the loop
    state = _state(graph)
    c = Crossing(tensor, read, shape, gradient, kind, sent_shape, wire)
    with state.lock:
        state.crossings.append(c)
        state.by_op[read.op.name] = c
    return read


def _same_device(a: str, b: str) -> bool:
    if not a or not b:
        return a == b
    tf = _tf()
    return tf.DeviceSpec.from_string(a) == tf.DeviceSpec.from_string(b)


def _crossing_gradient(op, grad):
    """A crossing's gradient crosses back to where its tensor was made: dense (it was dense there), narrowed
    and widened again by the crossing's ``gradient`` pair where it has one (a 16-bit wire)."""
    tf = _tf()
    tf1 = tf.compat.v1
    c = _state(op.graph).by_op.get(op.name)
    if c is None or grad is None:       # a graph imported from elsewhere: a plain Identity
        return grad
    graph = op.graph
    # ignore_existing: under colocate_gradients_with_ops TF already colocates this with the crossing's reader.
    with graph.colocate_with(op, ignore_existing=True):
        if isinstance(grad, tf.IndexedSlices):
            grad = tf.convert_to_tensor(grad)   # summed where it was made, before it travels
        narrowed, widen = (c.gradient[0](grad), c.gradient[1]) if c.gradient else ([grad], None)
    shape = None
    if not c.sent.shape.is_fully_defined():
        shape = c.sent_shape
        if shape is None:
            with graph.colocate_with(c.sent.op, ignore_existing=True):
                shape = tf.shape(c.sent)
    back = [cross(t, c.sent.op.device, shape=shape if t.shape.rank else None, wire=c.wire) for t in narrowed]
    if widen is None:
        return back[0]
    with graph.colocate_with(None, ignore_existing=True), tf1.device(c.sent.op.device):
        return widen(back)


# ---------------------------------------------------------------- packing
def _packable(c: Crossing) -> bool:
    dtype = c.sent.dtype
    if dtype != dtype.base_dtype or dtype.name not in _PACKABLE:
        return False
    if _in_control_flow(c.sent.op) or _in_control_flow(c.read.op):
        return False
    if c.sent.shape.is_fully_defined() or c.shape is not None:
        return True
    # Its size travels in front of the pack: the reader reshapes by the static trailing dims.
    return dtype.name in _SIZED and c.sent.shape.rank is not None and c.sent.shape[1:].is_fully_defined()


def _walk(by_op) -> gate.Walk:
    """Each op's ``(level, sources)``: crossings before it on any path (counting one more where one is), and the
    names of the sources it depends on."""
    def value(op, inputs):
        level = max((lv for lv, _ in inputs), default=0) + (1 if op.name in by_op else 0)
        found = frozenset().union(*(src for _, src in inputs))
        return level, (found | {op.name} if is_source(op) else found)
    return gate.Walk(value, (0, frozenset()))


def pack(graph) -> int:
    """Pack the graph's crossings that have not been packed (see the module doc); returns how many now travel
    in packs. Idempotent; a finalized graph is left as it is."""
    state = _state(graph)
    with state.lock:
        pending = [c for c in state.crossings if not c.packed]
        if not pending or graph.finalized:
            return 0
        copy_small_constants(graph)
        for c in pending:
            c.packed = True
        walk = _walk(state.by_op)
        groups, alone = {}, []
        for c in pending:
            # A crossing nothing reads (a table's whole read, made with the table) must not ride along a pack.
            if not any(t.consumers() for t in c.read.op.outputs):
                continue
            if not _packable(c):
                alone.append(c)
                continue
            level, sources = walk.of(c.sent.op)
            key = (_device(c.sent.op.device), _device(c.read.op.device), c.sent.dtype, c.wire, level, sources)
            groups.setdefault(key, []).append(c)
        packed = 0
        for (src, dst, _, wire, _, _), members in groups.items():
            if len(members) > 1:
                _pack(graph, src, dst, members, state.packs, wire)
                state.packs += 1
                packed += len(members)
            else:
                alone.extend(members)
        for c in alone:
            if c.wire:
                _narrow_alone(graph, c)
        return packed


#: A constant this small read on another task is copied there instead (an optimizer's learning rate, made on the
#: worker and read by every ps's update, was a transfer of its own each step).
SMALL_CONSTANT_BYTES = 1024


def copy_small_constants(graph) -> int:
    """Give each task that reads a small constant made on another task a copy of its own; returns how many."""
    tf = _tf()
    tf1 = tf.compat.v1
    copies = 0
    for op in graph.get_operations():
        if op.type != "Const" or not op.device or op.control_inputs or _in_control_flow(op):
            continue        # a constant with control inputs runs after them: a copy would not
        value = op.get_attr("value")
        if len(value.SerializeToString()) > SMALL_CONSTANT_BYTES:
            continue
        here = gate.task_of_device(op.device)
        made = {}
        for reader in {c for c in op.outputs[0].consumers()}:
            if not reader.device or gate.task_of_device(reader.device) == here or _in_control_flow(reader):
                continue
            device = device_of(reader)
            if device not in made:
                with graph.colocate_with(None, ignore_existing=True), tf1.device(device), \
                        tf1.name_scope(op.name + "/"):
                    made[device] = tf.constant(tf.make_ndarray(value), dtype=op.outputs[0].dtype, name="copy")
                copies += 1
            for i, x in enumerate(reader.inputs):
                if x is op.outputs[0]:
                    reader._update_input(i, made[device])  # noqa: SLF001 (before any session ran the graph)
    return copies


def _device(name: str) -> str:
    """A device name spelled one way: ``/job:ps/task:0``, ``/job:ps/replica:0/task:0`` and
    ``/job:ps/task:0/device:CPU:0`` are one device (a task's ops go to its first CPU unless placed; on a GPU task
    an op placed there reaches that CPU by a local copy, never across the wire)."""
    spec = _tf().DeviceSpec.from_string(name or "")
    if not spec.job:
        return spec.to_string()
    return spec.replace(replica=None, device_type=spec.device_type or "CPU",
                        device_index=spec.device_index or 0).to_string()


def device_of(op) -> str:
    """``op``'s device, spelled one way (:func:`_device`)."""
    return _device(op.device)


def _narrow_alone(graph, c: Crossing):
    """``c`` in its wire by itself: cast where it is made, back where it is read."""
    tf = _tf()
    with graph.colocate_with(c.sent.op, ignore_existing=True), tf.compat.v1.name_scope(c.read.op.name + "_wire/"):
        sent = tf.cast(c.sent, c.wire, name="sent")
    with graph.colocate_with(c.read.op, ignore_existing=True), tf.compat.v1.name_scope(c.read.op.name + "_wire/"):
        received = tf.cast(sent, c.sent.dtype, name="received")
    c.read.op._update_input(0, received)  # noqa: SLF001 (before any session ran the graph)


def _pack(graph, src: str, dst: str, members: list, number: int, wire: str = ""):
    """One tensor from ``src`` to ``dst`` carrying ``members`` (in ``wire``'s type, where one is named); each
    member's reader reads its piece."""
    tf = _tf()
    tf1 = tf.compat.v1
    dtype = members[0].sent.dtype
    sized = [c for c in members if not c.sent.shape.is_fully_defined() and c.shape is None]
    with graph.colocate_with(None, ignore_existing=True), tf1.name_scope(f"tfcluster_pack_{number}/"):
        with tf1.device(src):
            flat = [c.sent if c.sent.shape.rank == 1 else tf.reshape(c.sent, [-1]) for c in members]
            head = [tf.stack([tf.size(f, out_type=dtype) for c, f in zip(members, flat) if c in sized])] \
                if sized else []
            sent = tf.concat(head + flat, 0, name="concat" if wire else "sent")
            if wire:
                sent = tf.cast(sent, wire, name="sent")
        with tf1.device(dst):
            received = tf.cast(sent, dtype, name="received") if wire else tf.identity(sent, name="received")
            sizes, trailing = _sizes(received, members, sized)
            body = received[len(sized):] if sized else received
            for c, piece, shape in zip(members, tf.split(body, sizes, num=len(members)), trailing):
                if isinstance(shape, list) and len(shape) == 1:     # a vector: its piece is already its shape
                    piece.set_shape(c.sent.shape)
                else:
                    piece = tf.reshape(piece, shape)
                c.read.op._update_input(0, piece)  # noqa: SLF001 (see the module doc)


def _sizes(received, members, sized):
    """``(sizes, shapes)`` the reader splits and reshapes ``received`` by: static where known, else the reader's
    row count times the fixed dimensions or its shape tensor, else the size carried in front of the pack."""
    tf = _tf()
    if sized and len(sized) == len(members):        # every size travels in front: read them as one vector
        return received[:len(sized)], [[-1] + c.sent.shape[1:].as_list() for c in members]
    sizes, shapes = [], []
    carried = {id(c): i for i, c in enumerate(sized)}
    for c in members:
        static = c.sent.shape
        if static.is_fully_defined():
            sizes.append(static.num_elements())
            shapes.append(static.as_list())
        elif isinstance(c.shape, (list, tuple)):
            rows, fixed = c.shape[0], [int(d) for d in c.shape[1:]]
            width = math.prod(fixed)
            sizes.append(rows if width == 1 else rows * width)
            shapes.append([-1] + fixed)
        elif c.shape is not None:
            sizes.append(tf.reduce_prod(c.shape))
            shapes.append(c.shape)
        else:
            sizes.append(received[carried[id(c)]])
            shapes.append([-1] + static[1:].as_list())
    tensors = [s for s in sizes if isinstance(s, tf.Tensor)]
    dtype = tf.int64 if any(s.dtype == tf.int64 for s in tensors) else tf.int32
    return tf.stack([tf.cast(s, dtype) if isinstance(s, tf.Tensor) else s for s in sizes]), shapes


def pending(graph) -> int:
    """How many of the graph's crossings are not packed yet."""
    return sum(1 for c in _state(graph).crossings if not c.packed)


def _packing_first(method):
    def wrapped(self, *args, **kwargs):
        graph = getattr(self, "_graph", None) if method.__name__ == "_extend_graph" else self
        if graph is not None and not graph.finalized:
            if pending(graph):
                pack(graph)
            if gate.pending(graph):
                gate.gate(graph)       # after packing: a ticket reads a pack where the weights travel in one
        return method(self, *args, **kwargs)
    wrapped.__name__, wrapped.__doc__, wrapped.__wrapped__ = method.__name__, method.__doc__, method
    return wrapped


def install():
    """Pack every graph's crossings, and gate what a trainer's step reads (graph/gate.py), before its first step
    and before it is finalized (idempotent, per process)."""
    from ..core import patches
    patches.install("crossing.pack_before_run")
    patches.install("crossing.pack_before_finalize")


def _register_patches():
    from ..core import patches
    patches.register(patches.Patch(
        "crossing.pack_before_run", "tensorflow.python.client.session:BaseSession._extend_graph",
        "a graph's crossings between devices are packed (one transfer per pair of devices and step), and what a "
        "trainer's step reads waits for its ps tasks to take the step (graph/gate.py), before a session first "
        "sends its ops to TF's runtime", _packing_first, "fit's ps strategies, the Estimator, TF1 mode, every "
        "training session",
        params=("self",)))
    patches.register(patches.Patch(
        "crossing.pack_before_finalize", "tensorflow.python.framework.ops:Graph.finalize",
        "crossings are packed and a step's reads gated before a graph is finalized (MonitoredTrainingSession "
        "and the Supervisor finalize it before their first session)", _packing_first, "fit's ps strategies, the "
        "Estimator, TF1 mode, every training session",
        params=("self",)))


_register_patches()
