"""A table saved in P parts and restored into P' parts: every id keeps its own row, whatever the lookups' strategy.

A partitioned variable is saved as one tensor (its parts are slices of it) and
restored into any split by slices of that tensor. With lookups by
``partition_strategy="div"`` (TF 2's ``tf.nn.embedding_lookup``, the feature
columns) row ``r`` of that tensor is id ``r`` for every split, so those tables
restore into any part count as they are. TF 1.x's ``tf.compat.v1.nn.embedding_lookup``
defaults to ``"mod"``: id ``i`` is row ``i // P`` of part ``i % P``, so row ``r`` of
the saved tensor is another id for every ``P``. Restored into another part count
(a cluster with another number of ps, or one process for export) each id would
get another id's row, silently: TF 1.x itself does that (docs/embeddings.md).

So tfcluster records the tables looked up with ``"mod"`` (:func:`record_lookup`,
called by the lookup in graph/sparse.py), writes beside the checkpoints how
each of them and its optimizer slots was split when a checkpoint was saved
(``tfcluster-tables.json``, one entry per checkpoint still on disk), and when
a checkpoint is restored into another split it reads each part's rows from the
saved parts that hold its ids: one saved part at a time (``RestoreV2`` of a
slice), on the device of the part being filled, so no task ever holds the
whole table. The other variables are restored by a ``Saver`` over them alone
in the same step, so no variable is ever seen holding another id's row (a
worker waits until every variable is initialised). A checkpoint saved without
that record (by TF 1.x itself) is read through its ``.meta`` graph, which
lists its parts, taking the lookups to be the restoring program's; with
neither, its rows are restored as TF 1.x would, and a warning says so.

TensorFlow is imported lazily, so importing this module stays cheap.
"""

import functools
import json
import logging
import os

from ..core import patches
from .placement import parts_of

log = logging.getLogger("tfcluster")

#: The graph collection of the variables (their names) that a "mod" lookup reads.
MOD_LOOKUPS = "tfcluster_mod_lookups"
#: The file beside the checkpoints saying how their "mod" tables were split.
RECORD = "tfcluster-tables.json"


def record_lookup(params, partition_strategy: str):
    """Note in the graph that ``params`` (a table, in parts or not) is looked up with ``partition_strategy``."""
    if partition_strategy != "mod":
        return
    import tensorflow as tf
    for part in parts_of(params):
        if isinstance(part, tf.Variable) and part.op.name not in part.graph.get_collection(MOD_LOOKUPS):
            part.graph.add_to_collection(MOD_LOOKUPS, part.op.name)


class Split:
    """How one checkpoint name (a table or one of its slots) is split: rows of each part, and the lookup."""

    def __init__(self, parts, mod: bool):
        self.parts = [tuple(p) for p in sorted(parts)]      # (first row, rows), in row order
        self.mod = mod

    def key(self):
        """Equal for two splits that map every id to the same row of the whole saved tensor."""
        return ("mod", tuple(self.parts)) if self.mod and len(self.parts) > 1 else ("div",)

    def to_json(self):
        """The record's entry."""
        return {"parts": [list(p) for p in self.parts], "lookup": "mod" if self.mod else "div"}


def _names_to_variables(saver) -> dict:
    """The checkpoint names ``saver`` saves, each with its variable parts (as ``Saver`` itself groups them)."""
    from tensorflow.python.training.saving import saveable_object_util
    var_list = saver._var_list
    if var_list is None:        # a Saver not built yet (defer_build) saves nothing yet
        return {}
    names = dict(var_list) if isinstance(var_list, dict) else saveable_object_util.op_list_to_dict(
        var_list, convert_variable_to_tensor=False)
    return names


def _split_of(parts, mod: bool) -> Split:
    """The split of these variables: their slice infos, or one part of all the rows."""
    rows = []
    for v in parts:
        info = getattr(v, "_save_slice_info", None)
        if info is None:
            rows.append((0, int(v.shape[0])))
        else:
            rows.append((int(info.var_offset[0]), int(info.var_shape[0])))
    return Split(rows, mod)


def _full_shape(parts) -> list:
    """The shape of the whole variable these parts are of."""
    info = getattr(parts[0], "_save_slice_info", None)
    return list(info.full_shape) if info is not None else parts[0].shape.as_list()


def graph_splits(saver, graph) -> dict:
    """{checkpoint name: Split} of the tables ``graph`` looks up with "mod", and of their slots."""
    mod = set(graph.get_collection(MOD_LOOKUPS))
    names = _names_to_variables(saver)
    tables = {name: _full_shape(parts_of(value))[0] for name, value in names.items()
              if any(getattr(getattr(v, "op", None), "name", None) in mod for v in parts_of(value))}
    out = {}
    for name, value in names.items():
        parts = parts_of(value)
        if not (hasattr(parts[0], "shape") and parts[0].shape.rank):
            continue
        # The table, and its optimizer slots: named below it, with as many rows.
        if any((name == t or name.startswith(t + "/")) and _full_shape(parts)[0] == rows
               for t, rows in tables.items()):
            out[name] = _split_of(parts, mod=True)
    return out


# ------------------------------------------------------------------ the record beside the checkpoints
def _record_path(prefix: str) -> str:
    return os.path.join(os.path.dirname(prefix), RECORD)


def _read_record(prefix: str) -> dict:
    import tensorflow as tf
    path = _record_path(prefix)
    try:
        with tf.io.gfile.GFile(path) as f:
            return json.load(f).get("checkpoints", {})
    except (tf.errors.NotFoundError, ValueError, OSError):
        return {}


def write_record(prefix: str, splits: dict):
    """Say beside checkpoint ``prefix`` how its "mod" tables were split; forget checkpoints no longer on disk."""
    import tensorflow as tf
    record = {name: entry for name, entry in _read_record(prefix).items()
              if tf.io.gfile.exists(os.path.join(os.path.dirname(prefix), name) + ".index")}
    record[os.path.basename(prefix)] = {name: s.to_json() for name, s in splits.items()}
    path = _record_path(prefix)
    tmp = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(tmp, "w") as f:
        json.dump({"checkpoints": record}, f, sort_keys=True)
    tf.io.gfile.rename(tmp, path, overwrite=True)


def _splits_in_meta(prefix: str, mod_names) -> dict:
    """The splits of ``mod_names`` in the checkpoint's ``.meta`` graph (written by TF 1.x's Saver); None without one."""
    import tensorflow as tf
    from tensorflow.core.framework import variable_pb2
    from tensorflow.core.protobuf import meta_graph_pb2
    path = prefix + ".meta"
    if not tf.io.gfile.exists(path):
        return None
    meta = meta_graph_pb2.MetaGraphDef()
    with tf.io.gfile.GFile(path, "rb") as f:
        meta.ParseFromString(f.read())
    rows = {}
    for raw in meta.collection_def["variables"].bytes_list.value:
        var = variable_pb2.VariableDef.FromString(raw)
        info = var.save_slice_info_def
        if info.full_name in mod_names:
            rows.setdefault(info.full_name, []).append((int(info.var_offset[0]), int(info.var_shape[0])))
    return {name: Split(parts, True) for name, parts in rows.items()}


def saved_splits(prefix: str, now: dict):
    """{name: Split} as checkpoint ``prefix`` was saved, for the names in ``now`` and the record; None if unknown."""
    entry = _read_record(prefix).get(os.path.basename(prefix))
    if entry is not None:
        saved = {name: Split(s["parts"], s["lookup"] == "mod") for name, s in entry.items()}
        # A name the record does not list was looked up by "div" (or not at all) then: row r is id r.
        return {name: saved.get(name, Split([(0, 1)], False)) for name in set(now) | set(saved)}
    meta = _splits_in_meta(prefix, set(now))
    if meta is not None:
        return {name: meta.get(name, Split([(0, 1)], False)) for name in now}
    return None


# ------------------------------------------------------------------ the restore
def _slice_spec(full_shape, first: int, rows: int) -> str:
    """``RestoreV2``'s spec of rows ``first .. first + rows`` of a tensor of ``full_shape``."""
    return " ".join(str(d) for d in full_shape) + " " + ":".join([f"{first},{rows}"] + ["-"] * (len(full_shape) - 1))


def _fill_part(part, index: int, now: Split, saved: Split, name: str, prefix: str, full_shape):
    """An op assigning to ``part`` (number ``index`` of ``now``) its ids' rows from the saved parts."""
    import tensorflow as tf
    from tensorflow.python.ops import io_ops
    first, rows = now.parts[index]
    count = len(now.parts)
    ids = tf.range(rows, dtype=tf.int64) * count + index if now.mod and count > 1 \
        else tf.range(first, first + rows, dtype=tf.int64)
    if saved.mod and len(saved.parts) > 1:
        starts = tf.constant([p[0] for p in saved.parts], tf.int64)
        at = tf.gather(starts, ids % len(saved.parts)) + ids // len(saved.parts)
    else:
        at = ids
    positions, pieces, previous = [], [], []
    for start, length in saved.parts:
        inside = tf.logical_and(at >= start, at < start + length)
        # One saved part read at a time: the next read waits for this one's rows to be picked out.
        with tf.control_dependencies(previous):
            piece = io_ops.restore_v2(prefix, [name], [_slice_spec(full_shape, start, length)],
                                      [part.dtype.base_dtype])[0]
        picked = tf.gather(piece, tf.boolean_mask(at, inside) - start)
        positions.append(tf.cast(tf.where(inside)[:, 0], tf.int32))
        pieces.append(picked)
        previous = [picked]
    value = tf.dynamic_stitch(positions, pieces)
    return tf.compat.v1.assign(part, value)


def remap_restore(saver, sess, prefix: str) -> bool:
    """Restore ``prefix`` through ``saver``, reading the rows of "mod" tables split otherwise when it was saved;
    False (nothing done) when no table needs it."""
    import tensorflow as tf
    from tensorflow.python.checkpoint import checkpoint_management
    if not checkpoint_management.checkpoint_exists_internal(prefix):
        return False        # Saver.restore says so in its own words
    graph = sess.graph
    now = graph_splits(saver, graph)
    record = _read_record(prefix)
    if not now and not record.get(os.path.basename(prefix)):
        return False
    saved = saved_splits(prefix, now)
    if saved is None:
        if any(len(s.parts) > 1 for s in now.values()):
            log.warning("checkpoint %s does not say how its tables were split when it was saved: tables looked up "
                        "with partition_strategy='mod' are restored as TF 1.x would, right only for the same split "
                        "(docs/embeddings.md)", prefix)
        return False
    names = _names_to_variables(saver)
    moved = [n for n in names if n in saved and saved[n].key() != now.get(n, Split([(0, 1)], False)).key()]
    if not moved:
        return False
    log.info("restoring %s: %d table part(s) split otherwise when saved, read by id", prefix, len(moved))
    finalized = graph.finalized
    if finalized:
        graph._unsafe_unfinalize()      # the session was made from a finalized graph; it runs the added ops too
    try:
        with graph.as_default(), graph.device(None), tf.control_dependencies(None), \
                tf.compat.v1.name_scope("tfcluster_repartition"):
            fills = []
            for name in moved:
                parts = sorted(parts_of(names[name]), key=lambda v: _split_of([v], False).parts[0])
                split = now.get(name) or _split_of(parts, False)
                for index, part in enumerate(parts):
                    with tf.device(part.device):
                        fills.append(_fill_part(part, index, split, saved[name], name, prefix, _full_shape(parts)))
            fill = tf.group(*fills)     # the ops, not their values: nothing comes back to this process
            rest = {n: v for n, v in names.items() if n not in moved}
            others = tf.compat.v1.train.Saver(rest, sharded=saver._sharded, allow_empty=True,
                                              write_version=saver._write_version) if rest else None
    finally:
        if finalized:
            graph.finalize()
    fetches = [fill] + ([others.saver_def.restore_op_name] if others else [])
    sess.run(fetches, {others.saver_def.filename_tensor_name: prefix} if others else None)
    return True


def _saving(save):
    @functools.wraps(save)
    def saving(self, sess, save_path, *args, **kwargs):
        path = save(self, sess, save_path, *args, **kwargs)
        if path and sess is not None:
            splits = graph_splits(self, sess.graph)
            if splits or _read_record(path):   # once there is a record, every checkpoint has an entry
                write_record(path, splits)
        return path
    return saving


def _restoring(restore):
    @functools.wraps(restore)
    def restoring(self, sess, save_path):
        if sess is None or save_path is None or self._is_empty or \
                not remap_restore(self, sess, str(save_path)):
            return restore(self, sess, save_path)
    return restoring


patches.register(patches.Patch(
    "repartition.save", "tensorflow.python.training.saver:Saver.save",
    'a save records how the "mod" tables it holds were split, for a restore into another split',
    _saving, "fit's ps strategies, the Estimator, TF1 mode", params=("self", "sess", "save_path")))
patches.register(patches.Patch(
    "repartition.restore", "tensorflow.python.training.saver:Saver.restore",
    "a restore reads a table saved in another number of parts by id", _restoring,
    "fit's ps strategies, the Estimator, TF1 mode", params=("self", "sess", "save_path")))


def install():
    """Patch ``Saver.save`` to record how "mod" tables were split and ``Saver.restore`` to read them by id."""
    patches.install("repartition.save")
    patches.install("repartition.restore")
