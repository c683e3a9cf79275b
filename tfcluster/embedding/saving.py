"""An embedding variable in checkpoints: each part saved by its own ps, rows evicted as it saves.

A part saves DeepRec's layout under its name (``<variable>/part_<i>``):
``-keys``, ``-values`` (weights), ``-slots``, ``-freqs``, ``-versions`` for
the ids that have a row, and ``-keys_filtered``, ``-freqs_filtered``,
``-versions_filtered`` for the ids training saw but has not admitted yet. The
rows are read in one lookup of the part's table, so a row's weights and slots
are of one moment even while async training writes it. Before it is saved a
part drops, from both tables, the rows its eviction option names: untouched
for more than ``steps_to_live`` global steps (the newest step the part saw
where the graph has no global step), or weights of L2 norm below
``l2_weight_threshold`` (DeepRec evicts at each save as well); the tables are
rebuilt without those rows, so their memory comes back. A restore puts back
exactly what was saved. A full save also starts the next increment afresh
(:mod:`.increments`).
"""

import contextlib

from .variable import Part, pack, tensorflow_v2, unpack

#: The names a part saves, in its saveable's order.
FIELDS = ("keys", "values", "slots", "freqs", "versions", "keys_filtered", "freqs_filtered", "versions_filtered")


def _saveable_class():
    from tensorflow.python.training.saving import saveable_object

    class PartSaveable(saveable_object.SaveableObject):
        """One part's tables as checkpoint tensors (see the module doc)."""

        def __init__(self, part: Part):
            self.part = part
            tensors = saved_tensors(part)
            specs = [saveable_object.SaveSpec(t, "", f"{part.name}-{field}", device=part.device)
                     for field, t in zip(FIELDS, tensors)]
            # Named by the table's op, as TF names its own tables' saveables: a meta graph export (a SavedModel,
            # MTS's .meta) stores the graph's saveables by name, and its import finds them again.
            super().__init__(part.values, specs, part.values.op.name)

        def restore(self, restored_tensors, restored_shapes):
            return restore_part(self.part, *restored_tensors)
    return PartSaveable


_CLASS = []


def _saveable_class_cached():
    """The SaveableObject class (made once TensorFlow is imported)."""
    if not _CLASS:
        _CLASS.append(_saveable_class())
    return _CLASS[0]


def saveable(part: Part):
    """The SaveableObject of ``part``."""
    return _saveable_class_cached()(part)


def saved_tensors(part: Part) -> list:
    """The tensors of :data:`FIELDS`, after this save's eviction (the part's tables rebuilt without the evicted
    rows once they are read: :meth:`.variable.Part.compact`)."""
    tf = tensorflow_v2()
    v = part.variable
    d = v.dim
    with tf.device(part.device), tf.name_scope(f"save_{part.name.replace('/', '_')}"):
        with tf.control_dependencies([part.take_marked()]):      # increments start afresh at a full save
            (keys, rows), (waiting, meta) = part.export()
        freqs, versions = unpack(rows)
        evict, evict_waiting = tf.zeros_like(freqs, tf.bool), tf.zeros_like(meta[:, 0], tf.bool)
        if v.option.steps_to_live is not None:
            step = tf.compat.v1.train.get_global_step(part.variable.graph)
            # Without a global step, the newest step this part saw stands for it.
            now = tf.cast(step, tf.int64) if step is not None else tf.reduce_max(tf.concat([versions, [0]], 0))
            evict = now - versions > v.option.steps_to_live
            evict_waiting = now - meta[:, 1] > v.option.steps_to_live
        if v.option.l2_weight_threshold is not None:
            evict = tf.logical_or(evict, tf.norm(rows[:, :d], axis=1) < v.option.l2_weight_threshold)
        if part.unadmitted is not None:     # an id admitted since it waited keeps its count in its row alone
            evict_waiting = tf.logical_or(evict_waiting, part.find(waiting)[1])
        kept, kept_waiting = tf.logical_not(evict), tf.logical_not(evict_waiting)
        keys, rows = tf.boolean_mask(keys, kept), tf.boolean_mask(rows, kept)
        waiting, meta = tf.boolean_mask(waiting, kept_waiting), tf.boolean_mask(meta, kept_waiting)
        freqs, versions = unpack(rows)
        saved = [keys, rows[:, :d], rows[:, d:3 * d], freqs, versions, waiting, meta[:, 0], meta[:, 1]]
        with tf.control_dependencies(saved):
            compact = part.compact(tf.reduce_any(evict), keys, rows, waiting, meta)
        with tf.control_dependencies([compact]):
            return [tf.identity(t) for t in saved]


def restore_part(part: Part, *saved, which=None):
    """The op replacing ``part``'s tables by these saved tensors (:data:`FIELDS`), each table rebuilt in buckets
    sized for them (one insert, no growth on the way); ``which``: a mask of the ids it keeps."""
    tf = tensorflow_v2()
    v = part.variable
    with tf.device(part.device):
        keys, rows, waiting, meta = _rows(part, *saved, which=which)
        ops = [part.rebuild(part.values, tf.float32, v.width, keys, rows),
               part.rebuild(part.touched, tf.bool, None, tf.zeros([0], v.key_dtype), tf.zeros([0], tf.bool))]
        if part.unadmitted is not None:     # a variable restored without its filter forgets who waited
            ops.append(part.rebuild(part.unadmitted, tf.int64, 2, waiting, meta))
        return tf.group(*ops)


def apply_part(part: Part, *saved, which=None):
    """The op writing these saved rows and waiting counts (:data:`FIELDS`) into ``part``'s tables over what they
    hold. ``which``: a mask of the ids it keeps."""
    tf = tensorflow_v2()
    with tf.device(part.device):
        keys, rows, waiting, meta = _rows(part, *saved, which=which)
        ops = [tf.raw_ops.LookupTableInsertV2(table_handle=part.values, keys=keys, values=rows)]
        if part.unadmitted is not None:
            # (an id given a row here that still waits there is read by its row, and dropped there at the next save)
            ops.append(tf.raw_ops.LookupTableInsertV2(table_handle=part.unadmitted, keys=waiting, values=meta))
        return tf.group(*ops)


def _rows(part: Part, keys, values, slots, freqs, versions, keys_filtered, freqs_filtered, versions_filtered,
          which=None):
    """``(keys, rows, waiting keys, [count, last step])`` of saved tensors, as the part's tables hold them."""
    tf = tensorflow_v2()
    v = part.variable
    d = v.dim
    keys, keys_filtered = tf.reshape(keys, [-1]), tf.reshape(keys_filtered, [-1])
    rows = tf.concat([tf.reshape(values, [-1, d]), tf.reshape(slots, [-1, 2 * d]), pack(freqs, versions)], 1)
    meta = tf.stack([tf.reshape(freqs_filtered, [-1]), tf.reshape(versions_filtered, [-1])], 1)
    if which is not None:
        mine, mine_waiting = which(keys), which(keys_filtered)
        keys, rows = tf.boolean_mask(keys, mine), tf.boolean_mask(rows, mine)
        keys_filtered, meta = tf.boolean_mask(keys_filtered, mine_waiting), tf.boolean_mask(meta, mine_waiting)
    return keys, tf.reshape(rows, [-1, v.width]), keys_filtered, tf.reshape(meta, [-1, 2])


def saved_parts(names, variable) -> int:
    """How many parts of ``variable`` a checkpoint holding tensor ``names`` saved."""
    n = 0
    while f"{variable.name}/part_{n}-keys" in names:
        n += 1
    return n


def read_part(prefix, name: str, variable):
    """The saved tensors of part ``name`` of ``variable`` (RestoreV2 on the current device)."""
    tf = tensorflow_v2()
    from tensorflow.python.ops import io_ops
    key = variable.key_dtype
    dtypes = [key, tf.float32, tf.float32, tf.int64, tf.int64, key, tf.int64, tf.int64]
    return io_ops.restore_v2(prefix, [f"{name}-{f}" for f in FIELDS], [""] * len(FIELDS), dtypes)


def fill_ops(variables, names, prefix, write=restore_part) -> list:
    """Ops that ``write`` (:func:`restore_part`, :func:`apply_part`) every part of ``variables`` from every part
    saved in ``prefix`` (whose tensor ``names`` are these), each part keeping its own ids."""
    tf = tensorflow_v2()
    ops = []
    for v in variables:
        count = saved_parts(names, v)
        for part in v.parts:
            with tf.device(part.device):
                saved = [read_part(prefix, f"{v.name}/part_{j}", v) for j in range(count)]
                tensors = [tf.concat([s[i] for s in saved], 0) for i in range(len(FIELDS))] if saved else None
            if tensors is None:
                continue
            index = part.index

            def mine(keys, v=v, index=index):
                return tf.equal(v.part_of(keys), index)
            ops.append(write(part, *tensors, which=mine))
    return ops


@contextlib.contextmanager
def ops_added(graph, scope: str):
    """Add ops to ``graph`` (also where a session's graph was finalized: the session runs them all the same)."""
    tf = tensorflow_v2()
    finalized = graph.finalized
    if finalized:
        graph._unsafe_unfinalize()
    try:
        with graph.as_default(), tf.control_dependencies(None), tf.compat.v1.name_scope(scope):
            yield
    finally:
        if finalized:
            graph.finalize()


def parts_saved_by(saver) -> list:
    """The embedding-variable parts ``saver`` saves (:class:`~.variable.Part`)."""
    saved = saver._var_list or []
    return [s.part for s in (saved.values() if isinstance(saved, dict) else saved) if is_part_saveable(s)]


def is_part_saveable(saveable) -> bool:
    """Whether ``saveable`` is an embedding-variable part's."""
    return isinstance(saveable, _saveable_class_cached())


def without_parts(var_list, skip=()):
    """``var_list`` (a Saver's: a list, or a dict by name) without embedding-variable parts and the objects in
    ``skip``: what a Saver holds beside them."""
    skipped = {id(x) for x in skip}

    def kept(x):
        return id(x) not in skipped and not is_part_saveable(x)
    if isinstance(var_list, dict):
        return {name: x for name, x in var_list.items() if kept(x)}
    return [x for x in var_list if kept(x)]


def remap_restore(saver, sess, prefix: str) -> bool:
    """Restore ``prefix`` through ``saver`` with each embedding variable read by id from however many parts saved
    it; False (nothing done) when the parts saved are the parts now, so the Saver's own restore is right."""
    tf = tensorflow_v2()
    parts = parts_saved_by(saver)
    if not parts:
        return False
    try:
        names = set(tf.train.load_checkpoint(prefix).get_variable_to_dtype_map())
    except (tf.errors.OpError, ValueError):
        return False        # Saver.restore says what is wrong in its own words
    variables = list({id(p.variable): p.variable for p in parts}.values())
    if all(saved_parts(names, v) == len(v.parts) for v in variables):
        return False
    with ops_added(sess.graph, "tfcluster_ev_restore"):
        fill = tf.group(*fill_ops(variables, names, prefix))
        rest = without_parts(saver._var_list)
        others = tf.compat.v1.train.Saver(rest, sharded=saver._sharded, allow_empty=True) if rest else None
    sess.run(fill)
    if others is not None:
        others.restore(sess, prefix)
    return True
