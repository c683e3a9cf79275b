"""An embedding variable: a row per id in hash tables on the ps, created when training admits the id.

Each part (one per ps, by ``id mod parts``; string ids by their hash) is a
hash table on that ps, named by the variable so every worker's graph reaches
the same one. It maps an admitted id to its row: the weights, the optimizer's
slots, and the id's count and last global step (two int32 in float32 bits), so
a row is read and written whole and its weights, slots and counts always come
from one moment, also in a save during async training. Where ids must be seen
``filter_freq`` times first, a second table of the part counts the ids not yet
admitted. A lookup reads an admitted id's weights; an id training has not
admitted reads ``default_value_no_permission`` (with no filter every id is
admitted: one with no row yet reads row ``id mod default_value_dim`` of one
initial matrix, DeepRec's InitializerOption). Nothing is written by a lookup:
the optimizer's update (:mod:`.updates`) counts the ids, creates and trains the
rows, so evaluation and serving graphs never change the tables.

A zero-size variable of the same name stands for the table among the trainable
variables, so an optimizer's ``var_list`` (a scope's variables, as wide & deep
splits them) decides which optimizer trains it, as for any variable.
"""

import functools
import weakref

from ..core.errors import SpecError
from ..graph import crossing
from ..topology.cluster import Task
from .options import EmbeddingVariableOption

#: Per graph, its embedding variables and every lookup a training update may follow, ``(variable, part, ids,
#: counts, rows)``; kept here, not in graph collections, which a meta graph export would try to serialise.
_GRAPHS = weakref.WeakKeyDictionary()
#: Room for the slots of any optimizer served (Ftrl and Adam keep two per weight).
SLOTS = 2
#: The two keys each table reserves (free and deleted buckets), by key type.
EMPTY_KEYS = {"int64": (-1, -2), "string": ("\x00tfcluster:empty", "\x00tfcluster:deleted")}
#: A new table's buckets (a power of 2; it doubles as it fills): small, since a model may have many variables.
INITIAL_BUCKETS = 1024


class EmbeddingVariable:
    """A table of ``embedding_dim``-float rows keyed by int64 or string ids, split by id over ``parts`` devices."""

    def __init__(self, name: str, embedding_dim: int, key_dtype=None, initializer=None, ev_option=None,
                 parts=None, devices=None, trainable: bool = True, seed=None):
        tf = tensorflow_v2()
        tf1 = tf.compat.v1
        if int(embedding_dim) < 1:
            raise SpecError(f"embedding variable {name}: embedding_dim must be at least 1, not {embedding_dim}")
        self.key_dtype = tf.as_dtype(key_dtype or tf.int64)
        if self.key_dtype not in (tf.int64, tf.int32, tf.string):
            raise SpecError(f"embedding variable {name}: key_dtype must be tf.int64, tf.int32 or tf.string, "
                            f"not {self.key_dtype.name}")
        if self.key_dtype == tf.int32:
            self.key_dtype = tf.int64       # one key type on the ps; int32 ids are cast
        self.option = ev_option or EmbeddingVariableOption()
        self.dim, self.slots, self.trainable = int(embedding_dim), SLOTS, trainable
        self.width = self.dim * (1 + self.slots) + 2       # weights, slots, count, last step
        init = self.option.init_option
        initializer = initializer or init.initializer or tf1.truncated_normal_initializer(stddev=0.05, seed=seed)
        if isinstance(initializer, type):       # DeepRec's examples pass the class: tf.glorot_uniform_initializer
            initializer = initializer()
        self.anchor = tf1.get_variable(name, shape=[0], dtype=tf.float32, initializer=tf1.zeros_initializer(),
                                       trainable=trainable)
        self.name = self.anchor.op.name
        self.graph = self.anchor.graph
        devices = list(devices or _devices(self.anchor.device, parts))
        with tf1.device(devices[0]):
            self.initial = tf1.get_variable(f"{name}/initial_values", [init.default_value_dim, self.dim],
                                            initializer=initializer, trainable=False)
        self.parts = [Part(self, i, d) for i, d in enumerate(devices)]
        of_graph(self.graph)["variables"].append(self)

    def __repr__(self):
        return f"<EmbeddingVariable {self.name} dim={self.dim} parts={len(self.parts)}>"

    @property
    def filter_freq(self) -> int:
        """Lookups in training before an id gets a row (at least 1)."""
        return max(1, self.option.filter_freq)

    def ids(self, ids):
        """``ids`` as the tables' keys: int64 (int32 cast), or strings; one line for the wrong kind."""
        tf = tensorflow_v2()
        ids = ids if isinstance(ids, tf.Tensor) else tf.convert_to_tensor(ids)
        if (ids.dtype == tf.string) != (self.key_dtype == tf.string):
            raise SpecError(f"embedding variable {self.name} is keyed by {self.key_dtype.name}, and was looked up "
                            f"with {ids.dtype.name} ids")
        if ids.dtype == tf.string:
            return ids
        if ids.dtype not in (tf.int64, tf.int32):
            raise SpecError(f"embedding variable {self.name}: ids must be int64, int32 or strings, not "
                            f"{ids.dtype.name}")
        ids = tf.cast(ids, tf.int64)
        check = tf.debugging.assert_non_negative(ids, message=f"embedding variable {self.name}: negative ids")
        with tf.control_dependencies([check]):
            return tf.identity(ids)

    def part_of(self, ids):
        """Which part holds each id (int32): ``id mod parts``, or a string's hash mod parts."""
        tf = tensorflow_v2()
        n = len(self.parts)
        if ids.dtype == tf.string:
            return tf.cast(tf.strings.to_hash_bucket_fast(ids, n), tf.int32)
        return tf.cast(ids % n, tf.int32)

    def lookup(self, ids, name=None):
        """The rows of ``ids`` (any shape), shape ``ids.shape + [embedding_dim]``."""
        tf = tensorflow_v2()
        with tf.name_scope(name or f"{self.name.split('/')[-1]}_lookup"):
            ids = self.ids(ids)
            flat = tf.reshape(ids, [-1])
            unique, index, counts = tf.unique_with_counts(flat, out_idx=tf.int32)
            which = self.part_of(unique)
            n = len(self.parts)
            keys = tf.dynamic_partition(unique, which, n)
            counts = tf.dynamic_partition(tf.cast(counts, tf.int64), which, n)
            positions = tf.dynamic_partition(tf.range(tf.size(unique)), which, n)
            rows = []
            for part, sent, c in zip(self.parts, keys, counts):
                # Ids and counts cross to the part's ps and its rows back, each packed with the step's other
                # crossings there (graph/crossing.py); its update reads the ids and counts where they arrived.
                with tf.device(part.device):
                    k = crossing.cross(sent, part.device)
                    c = crossing.cross(c, part.device) if self.trainable else c
                    r = part.read(k)
                rows.append(crossing.cross(r, "", shape=[tf.size(sent), self.dim], kind="rows"))
                if self.trainable:
                    of_graph(self.graph)["lookups"].append((self, part, k, c, r))
            found = tf.dynamic_stitch(positions, rows)
            out = tf.gather(found, index)
            return tf.reshape(out, tf.concat([tf.shape(ids), [self.dim]], 0))


def _devices(placed: str, parts) -> list:
    """One device per part. Where the graph places variables on the ps (its stand-in went there), the parts go
    to ``/job:ps/task:<i mod ps>`` of TF_CONFIG's cluster, one per ps unless ``parts`` says; elsewhere (one
    process, an evaluation) all on the stand-in's device."""
    from ..topology.cluster import Cluster
    cluster = Cluster.from_environment() if "/job:ps" in (placed or "") else None
    ps = cluster.num_tasks("ps") if cluster is not None else 0
    n = max(1, int(parts or ps or 1))
    return [f"/job:ps/task:{i % ps}" if ps else (placed or None) for i in range(n)]


class Part:
    """One part of an embedding variable on one device: its rows' table, and its waiting ids' where a filter asks."""

    def __init__(self, variable: EmbeddingVariable, index: int, device):
        tf = tensorflow_v2()
        self.variable, self.index, self.device = variable, index, device
        self.name = f"{variable.name}/part_{index}"
        short = f"{variable.name.split('/')[-1]}_part_{index}"
        # TF's open-addressing table: rows in one flat buffer, so a write copies floats instead of allocating per
        # id (5x faster than MutableHashTable for a step's 6,000 rows of 48 floats, measured). Its two reserved keys
        # are ids no lookup may use: negative ones (refused) or strings beginning with a NUL byte.
        empty, deleted = EMPTY_KEYS[variable.key_dtype.name]
        tables = [(tf.float32, variable.width, "")] + ([(tf.int64, 2, "/unadmitted")] if variable.filter_freq > 1
                                                        else [])
        with tf.device(device):
            made = [tf.raw_ops.MutableDenseHashTableV2(
                empty_key=tf.constant(empty, variable.key_dtype), deleted_key=tf.constant(deleted, variable.key_dtype),
                value_dtype=dtype, value_shape=[width], initial_num_buckets=INITIAL_BUCKETS,
                shared_name=self.name + suffix, name=short + suffix.replace("/", "_"))
                for dtype, width, suffix in tables]
        self.values = made[0]
        # New ids take their first rows from a copy of the initial matrix on this part's own device, so a step
        # never waits on another ps for them; the copy is local (not saved) and reads the saved matrix after a
        # restore, when the session initialises local variables.
        self.initial = variable.initial
        if (device or "") != (variable.initial.device or ""):
            with tf.device(device):
                self.initial = tf.compat.v1.Variable(
                    variable.initial.read_value(), trainable=False, name=f"{short}_initial_values",
                    collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
        #: ``[count, last step]`` of the ids training saw but has not admitted (None with no filter).
        self.unadmitted = made[1] if len(made) > 1 else None
        # The ids updates wrote since the last save, for incremental saves (.increments); keys alone, so a few
        # bytes an id against a row's hundreds.
        with tf.device(device):
            self.touched = tf.raw_ops.MutableDenseHashTableV2(
                empty_key=tf.constant(empty, variable.key_dtype), deleted_key=tf.constant(deleted, variable.key_dtype),
                value_dtype=tf.bool, value_shape=[], initial_num_buckets=INITIAL_BUCKETS,
                shared_name=self.name + "/touched", name=short + "_touched")

    def _export(self, table, dtype):
        tf = tensorflow_v2()
        v = self.variable
        keys, values = tf.raw_ops.LookupTableExportV2(table_handle=table, Tkeys=v.key_dtype, Tvalues=dtype)
        keys = tf.reshape(keys, [-1])
        values = tf.reshape(values, [-1, v.width if dtype == tf.float32 else 2])
        empty, deleted = EMPTY_KEYS[v.key_dtype.name]
        used = tf.logical_and(tf.not_equal(keys, empty), tf.not_equal(keys, deleted))      # not free buckets
        return tf.boolean_mask(keys, used), tf.boolean_mask(values, used)

    def mark(self, keys):
        """The op recording that an update wrote the rows or counts of ``keys`` (run it after the writes)."""
        tf = tensorflow_v2()
        return tf.raw_ops.LookupTableInsertV2(table_handle=self.touched, keys=keys,
                                              values=tf.ones(tf.shape(keys), tf.bool))

    def marked(self):
        """The ids marked since the last take (a key twice where TF's table holds it twice)."""
        tf = tensorflow_v2()
        v = self.variable
        keys, _ = tf.raw_ops.LookupTableExportV2(table_handle=self.touched, Tkeys=v.key_dtype, Tvalues=tf.bool)
        keys = tf.reshape(keys, [-1])
        empty, deleted = EMPTY_KEYS[v.key_dtype.name]
        return tf.boolean_mask(keys, tf.logical_and(tf.not_equal(keys, empty), tf.not_equal(keys, deleted)))

    def take_marked(self):
        """The ids marked since the last take, unmarked before the returned tensor is computed: a save reads their
        rows after this, so an update that marks an id later is in the next save (.increments)."""
        tf = tensorflow_v2()
        keys = self.marked()
        unmark = tf.raw_ops.LookupTableRemoveV2(table_handle=self.touched, keys=keys)
        with tf.control_dependencies([unmark]):
            return tf.identity(keys)

    def rebuild(self, table, dtype, width, keys, values):
        """The op giving ``table`` fresh buckets that hold exactly ``keys`` (distinct) and ``values``.

        The rows' and waiting ids' tables drop keys only this way, never by removing them: TF's open-addressing
        table leaves a removed key's bucket marked deleted until it grows, so under churn a lookup of an absent id
        finds no free bucket to stop at (an internal error), and an insert that reuses a deleted bucket ahead of
        the key's own leaves a stale second copy behind it (tensorflow/core/kernels/lookup_table_op.cc; the churn
        test in tests/test_embedding_variables.py).
        """
        tf = tensorflow_v2()
        empty = EMPTY_KEYS[self.variable.key_dtype.name][0]
        n = tf.cast(tf.maximum(2 * tf.size(keys), INITIAL_BUCKETS), tf.float64)
        buckets = tf.cast(tf.pow(tf.constant(2.0, tf.float64), tf.math.ceil(tf.math.log(n) / tf.math.log(
            tf.constant(2.0, tf.float64)))), tf.int32)      # at most half full
        with tf.control_dependencies([keys, values]):       # the rows are read before the old buckets go
            # The bucket arrays as the table exports them, [buckets, 1] keys and [buckets, width or 1] values. The
            # table keeps and writes the very buffers it is given, so each table's are its own: made by ``Empty``,
            # which TF marks stateful so that Grappler neither folds it into a constant shared by every run nor
            # merges two tables' into one buffer. Of unknown shape to the graph, as a restore's are (the op's shape
            # check expects other ranks).
            unshaped = functools.partial(tf.compat.v1.placeholder_with_default, shape=None)
            key = self.variable.key_dtype
            fresh_keys = tf.raw_ops.Empty(shape=tf.stack([buckets, 1]), dtype=key, init=key != tf.string)
            fresh_keys = fresh_keys + tf.constant(empty, key) if key != tf.string else tf.strings.join(
                [fresh_keys, tf.constant(empty)])
            fresh = tf.raw_ops.LookupTableImportV2(
                table_handle=table, keys=unshaped(fresh_keys),
                values=unshaped(tf.raw_ops.Empty(shape=tf.stack([buckets, width or 1]), dtype=dtype, init=True)))
        with tf.control_dependencies([fresh]):
            return tf.raw_ops.LookupTableInsertV2(table_handle=table, keys=keys, values=values)

    def compact(self, evicting, keys, rows, waiting, meta):
        """The op a save runs after reading its rows: where it evicts (``evicting``), the rows' table rebuilt with
        the kept ``keys``/``rows``; the waiting ids' table rebuilt with the kept ``waiting``/``meta``. Rows updates
        wrote since the save read its own (still marked) are read again just before and kept too, so only a step
        racing the rebuild itself may lose that one update of a row, as two async steps racing on a row do."""
        tf = tensorflow_v2()
        v = self.variable
        recent = self.marked()
        recent_rows, present = self.find(recent)

        def rebuilt():
            with tf.control_dependencies([self.rebuild(
                    self.values, tf.float32, v.width, tf.concat([keys, tf.boolean_mask(recent, present)], 0),
                    tf.concat([rows, tf.boolean_mask(recent_rows, present)], 0))]):
                return tf.constant(True)
        ops = [tf.cond(evicting, rebuilt, lambda: tf.constant(False))]
        if self.unadmitted is not None:
            still = tf.boolean_mask(recent, tf.logical_not(present))
            still_meta = self.counts(still)
            seen = still_meta[:, 0] > 0
            ops.append(self.rebuild(self.unadmitted, tf.int64, 2, tf.concat([waiting, tf.boolean_mask(still, seen)], 0),
                                    tf.concat([meta, tf.boolean_mask(still_meta, seen)], 0)))
        return tf.group(*ops)

    def export(self):
        """``(keys, rows)`` of every admitted id, and ``(keys, [count, last step])`` of the others."""
        tf = tensorflow_v2()
        v = self.variable
        if self.unadmitted is not None:
            waiting = self._export(self.unadmitted, tf.int64)
        else:
            waiting = (tf.zeros([0], v.key_dtype), tf.zeros([0, 2], tf.int64))
        return self._export(self.values, tf.float32), waiting

    def counts(self, keys):
        """``[count, last step]`` of ids not admitted (``[0, -1]`` for an id training never looked up)."""
        tf = tensorflow_v2()
        return tf.reshape(tf.raw_ops.LookupTableFindV2(table_handle=self.unadmitted, keys=keys,
                                                       default_value=tf.constant([0, -1], tf.int64)), [-1, 2])

    def find(self, keys):
        """``(rows, present)``: the stored rows of ``keys`` and whether each has one."""
        tf = tensorflow_v2()
        # An absent row reads NaN first: a row's first weight is never NaN while training is sound.
        absent = tf.concat([[float("nan")], tf.zeros([self.variable.width - 1])], 0)
        rows = tf.reshape(tf.raw_ops.LookupTableFindV2(table_handle=self.values, keys=keys, default_value=absent),
                          [-1, self.variable.width])
        return rows, tf.logical_not(tf.math.is_nan(rows[:, 0]))

    def weights(self, keys, rows, present):
        """The weights of ``keys``: the stored ones, and for ids with no row, row ``id mod default_value_dim`` of
        the initial matrix."""
        tf = tensorflow_v2()
        v = self.variable
        d = v.option.init_option.default_value_dim
        new = tf.where(tf.logical_not(present))
        new_keys = tf.gather_nd(keys, new)
        at = tf.strings.to_hash_bucket_fast(new_keys, d) if keys.dtype == tf.string else new_keys % d
        return tf.tensor_scatter_nd_update(rows[:, :v.dim], new, tf.gather(self.initial, at))

    def read(self, keys):
        """The weights a lookup of ``keys`` reads (see the module doc)."""
        tf = tensorflow_v2()
        v = self.variable
        rows, present = self.find(keys)
        if v.filter_freq > 1:
            # Unadmitted ids read the default, in training and serving alike; the update that admits one starts
            # its row from the initial matrix (updates.py).
            admitted = present
        else:
            admitted = tf.ones_like(present)
        weights = self.weights(keys, rows, present)
        no_permission = tf.fill(tf.shape(weights), v.option.init_option.default_value_no_permission)
        return tf.where(admitted[:, None], weights, no_permission)


def tensorflow_v2():
    """TensorFlow's v2 API, also under TF1 mode, whose ``import tensorflow`` is ``tf.compat.v1`` (its ``tf.where``
    does not broadcast)."""
    from tensorflow import compat
    return compat.v2


def pack(count, step):
    """``[count, last step]`` as two float32 columns of a row (int32 bits: a row is one table value)."""
    tf = tensorflow_v2()
    both = tf.stack([tf.cast(tf.minimum(count, 2 ** 31 - 1), tf.int32), tf.cast(step, tf.int32)], 1)
    return tf.bitcast(both, tf.float32)


def unpack(rows):
    """``(count, last step)`` (int64) of rows written by :func:`pack` into their last two columns."""
    tf = tensorflow_v2()
    both = tf.cast(tf.bitcast(rows[:, -2:], tf.int32), tf.int64)
    return both[:, 0], both[:, 1]


def of_graph(graph) -> dict:
    """``{"variables": [...], "lookups": [...]}`` of ``graph``."""
    return _GRAPHS.setdefault(graph, {"variables": [], "lookups": []})


def embedding_variables(graph=None) -> list:
    """Every embedding variable of ``graph`` (the default graph)."""
    tf = tensorflow_v2()
    return list(of_graph(graph or tf.compat.v1.get_default_graph())["variables"])


def rows_per_ps(graph) -> dict:
    """``{"ps:0": tensor}``: the rows ``graph``'s embedding variables hold on each ps (the sizes of its parts)."""
    tf = tensorflow_v2()
    by_ps = {}
    for v in embedding_variables(graph):
        for part in v.parts:
            task = Task.of_device(part.device)
            if task is not None and task.job == "ps":       # not split(":")[-1]: /job:ps/task:1/device:CPU:0
                with graph.as_default(), tf.device(part.device):
                    by_ps.setdefault(str(task), []).append(
                        tf.raw_ops.LookupTableSizeV2(table_handle=part.values))
    with graph.as_default():
        return {ps: tf.add_n(sizes) for ps, sizes in by_ps.items()}
