"""Incremental saves: between full checkpoints, only the rows of embedding variables written since the last save.

A full checkpoint ``model.ckpt-<F>`` holds the whole model. An increment,
``increments/model.ckpt-<F>/model.ckpt-<step>`` beside it, holds what changed
since the save before it (the full one or the last increment): for each part of
each embedding variable, the ids that updates wrote since, in the full save's
layout (:data:`.saving.FIELDS`: rows, slots, counts, and the counts of ids still
waiting for admission), and the rest of the model whole (dense layers, fixed
tables, the global step; an embedding variable's initial matrix never changes
and is left out). They pay off where a model's state is its embedding
variables (docs/embeddings.md, "Incremental saves"). Eviction happens at full
saves only, so every row an increment holds is one training still has.

Which ids changed: each part marks the ids its updates wrote, after writing
them (:meth:`.variable.Part.mark`); a save takes the marks and clears them
before it reads the rows (:meth:`.variable.Part.take_marked`). An update whose
mark lands after the take is in the next save; one whose mark landed before
wrote its row before this save read it. So no write falls between two saves,
also in async training. (DeepRec records the ids inside its update kernels;
stock TensorFlow has no such kernel, so the marks are a third table per part.)

A restore of ``model.ckpt-<F>`` through any Saver that holds embedding
variables (``fit``'s, the Estimator's, a TF 1.x program's) then applies F's
increments in step order: rows and counts by id, the rest of the model from the
last one (the registered patch ``embedding.restore``, docs/patches.md, which
also reads a variable saved in another number of parts). An increment that
cannot be read (a file cut short) ends the restore at the one before it, in one
line, and it and every later one are set aside, so new increments chain on what
was restored.
"""

import functools
import logging
import os
import shutil

from ..core import patches
from ..core.tferrors import summary
from ..runtime.checkpoints import CHECKPOINT_NAME, checkpoints_on_disk, set_aside, step_in_name
from .saving import FIELDS, apply_part, fill_ops, ops_added, parts_saved_by, remap_restore, without_parts
from .variable import Part, embedding_variables, tensorflow_v2, unpack

log = logging.getLogger("tfcluster")

#: The dir beside the full checkpoints that holds each one's increments, in a dir named by it.
INCREMENTS_DIR = "increments"


def increments_dir(prefix: str) -> str:
    """Where the increments of full checkpoint ``prefix`` are."""
    return os.path.join(os.path.dirname(prefix), INCREMENTS_DIR, os.path.basename(prefix))


def increment_tensors(part: Part) -> list:
    """The tensors of :data:`.saving.FIELDS` for the ids of ``part`` written since the last save."""
    tf = tensorflow_v2()
    v = part.variable
    d = v.dim
    with tf.device(part.device), tf.name_scope(f"increment_{part.name.replace('/', '_')}"):
        keys = part.take_marked()
        rows, present = part.find(keys)
        admitted, rows = tf.boolean_mask(keys, present), tf.boolean_mask(rows, present)
        freqs, versions = unpack(rows)
        if part.unadmitted is not None:
            waiting = tf.boolean_mask(keys, tf.logical_not(present))
            meta = part.counts(waiting)
            seen = meta[:, 0] > 0
            waiting, meta = tf.boolean_mask(waiting, seen), tf.boolean_mask(meta, seen)
        else:
            waiting, meta = tf.zeros([0], v.key_dtype), tf.zeros([0, 2], tf.int64)
        return [admitted, rows[:, :d], rows[:, d:3 * d], freqs, versions, waiting, meta[:, 0], meta[:, 1]]


def _increment_class():
    from tensorflow.python.training.saving import saveable_object

    class IncrementSaveable(saveable_object.SaveableObject):
        """One part's rows written since the last save, as checkpoint tensors named as a full save names them."""

        def __init__(self, part: Part):
            self.part = part
            specs = [saveable_object.SaveSpec(t, "", f"{part.name}-{field}", device=part.device)
                     for field, t in zip(FIELDS, increment_tensors(part))]
            super().__init__(part.values, specs, part.values.op.name)

        def restore(self, restored_tensors, restored_shapes):
            return apply_part(self.part, *restored_tensors)
    return IncrementSaveable


def without_embedding_variables(var_list, graph):
    """``var_list`` (a Saver's) without embedding variables' parts, stand-ins and initial matrices: what an
    increment saves whole."""
    return without_parts(var_list, [x for v in embedding_variables(graph) for x in (v.anchor, v.initial)])


def rest_of_model(graph) -> list:
    """The graph's variables and saveables without its embedding variables (a default Saver's, less those)."""
    tf1 = tensorflow_v2().compat.v1
    with graph.as_default():
        saved = tf1.global_variables() + graph.get_collection(tf1.GraphKeys.SAVEABLE_OBJECTS)
    return without_embedding_variables(saved, graph)


class Increments:
    """The chief's incremental saves of ``graph``'s embedding variables (build it before the graph is finalized)."""

    def __init__(self, graph, sharded: bool):
        tf1 = tensorflow_v2().compat.v1
        parts = [p for v in embedding_variables(graph) for p in v.parts]
        cls = _increment_class()
        with graph.as_default(), tf1.name_scope("tfcluster_increments"):
            self.saver = tf1.train.Saver([cls(p) for p in parts] + rest_of_model(graph), sharded=sharded,
                                         save_relative_paths=True, max_to_keep=None, allow_empty=True)

    def save(self, session, base: str, step: int) -> str:
        """Write the increment of full checkpoint ``base`` at global step ``step``; its path. Increments of full
        checkpoints no longer on disk are removed."""
        where = increments_dir(base)
        os.makedirs(where, exist_ok=True)
        path = self.saver.save(session, os.path.join(where, CHECKPOINT_NAME), global_step=step,
                               write_meta_graph=False, write_state=False)
        prune(os.path.dirname(base))
        return path


def prune(checkpoint_dir: str) -> list:
    """Remove the increments of full checkpoints that are gone (rotated away); their dirs' names."""
    root = os.path.join(checkpoint_dir, INCREMENTS_DIR)
    gone = [name for name in (os.listdir(root) if os.path.isdir(root) else [])
            if not os.path.exists(os.path.join(checkpoint_dir, name + ".index"))]
    for name in gone:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return gone


def _readable(prefix: str):
    """None where every tensor of checkpoint ``prefix`` reads back, else why not (an increment is small)."""
    tf = tensorflow_v2()
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_dtype_map():
            reader.get_tensor(name)
    except (tf.errors.OpError, ValueError, IndexError) as e:     # IndexError: a data file cut short
        return summary(e)
    return None


def apply_increments(saver, sess, prefix: str) -> int:
    """After ``saver`` restored full checkpoint ``prefix``: apply its increments (see the module doc); how many."""
    tf = tensorflow_v2()
    parts = parts_saved_by(saver)
    found = checkpoints_on_disk(increments_dir(prefix)) if parts else []
    if not found:
        return 0
    variables = list({id(p.variable): p.variable for p in parts}.values())
    applied = []
    for i, increment in enumerate(found):
        why = _readable(increment)
        if why is not None:
            aside = [set_aside(p) for p in found[i:]][0]
            log.warning("checkpoints: increment %s of %s cannot be read (%s); the model is restored up to step %d, "
                        "and it and the %d after it are moved to %s", os.path.basename(increment),
                        os.path.basename(prefix), why, step_in_name(applied[-1] if applied else prefix),
                        len(found) - i - 1, aside)
            break
        names = set(tf.train.load_checkpoint(increment).get_variable_to_dtype_map())
        with ops_added(sess.graph, "tfcluster_increment_restore"):
            write = tf.group(*fill_ops(variables, names, increment, write=apply_part))
        sess.run(write)
        applied.append(increment)
    if applied:
        with ops_added(sess.graph, "tfcluster_increment_restore"):
            rest = without_embedding_variables(saver._var_list, sess.graph)
            last = tf.compat.v1.train.Saver(rest, sharded=saver._sharded, allow_empty=True)
        last.restore(sess, applied[-1])
        log.info("checkpoints: applied %d increment(s) after %s, up to global step %d", len(applied),
                 os.path.basename(prefix), step_in_name(applied[-1]))
    return len(applied)


def _restoring(restore):
    @functools.wraps(restore)
    def restoring(self, sess, save_path):
        if sess is None or save_path is None or self._is_empty:
            return restore(self, sess, save_path)
        if not remap_restore(self, sess, str(save_path)):
            restore(self, sess, save_path)
        apply_increments(self, sess, str(save_path))
    return restoring


patches.register(patches.Patch(
    "embedding.restore", "tensorflow.python.training.saver:Saver.restore",
    "a restore reads an embedding variable saved in another number of parts by id, then applies the increments "
    "saved after it", _restoring, "the first embedding variable a graph makes", params=("self", "sess", "save_path")))


def install():
    """Restore embedding variables by id from any number of saved parts, and their increments (once per process)."""
    patches.install("embedding.restore")
