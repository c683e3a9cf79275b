"""The chief's Saver: sharded, each ps writing its own variables at once, where every ps can write the checkpoint dir.

TF 1.x's Scaffold built ``Saver(sharded=True)``: one save op per device, so each
ps writes the variables it holds, in parallel, on its own disk, and only the
index is merged (on the last shard's device). Unsharded, every variable travels
to the chief and one thread writes them all: the whole model's state through one
task at every save, which a model of tables on several ps cannot afford
(docs/embeddings.md, "Capacity"). Sharded saves need a directory that every ps
writes where the chief reads it: the same machine, or a filesystem every task
mounts. :func:`ps_cannot_write` asks the ps tasks themselves, so a ps on
another machine, or in a container that mounts another disk at the same path, is
found before the first save; the chief then saves whole, as before, and says so.

Old checkpoints (one data file) restore into a sharded Saver and sharded ones
into a plain Saver in one process: V2 checkpoints are read by tensor name.
"""

import logging
import os
import uuid

log = logging.getLogger("tfcluster")

#: The chief's wait for every ps to write its probe file (one small op per ps; it waited for the ps already).
PROBE_TIMEOUT_SECS = 30
#: The file each ps writes in the checkpoint dir to show it writes where the chief reads (one name per ps: at most
#: one file is left on a machine that does not share the dir).
PROBE_NAME = ".tfcluster-ps-writes-{}"


def ps_cannot_write(cluster, target: str, checkpoint_dir: str, timeout: float = PROBE_TIMEOUT_SECS) -> dict:
    """The ps tasks that cannot write ``checkpoint_dir`` where this process reads it, each with why ({}: all can).

    Each ps writes a fresh token into the dir through its own op; this process reads the files back and removes
    them. A ps that writes elsewhere (another machine's disk at the same path) leaves a file this process never
    sees; a ps that cannot write at all fails its op.
    """
    import tensorflow as tf
    tf1 = tf.compat.v1
    ps = cluster.tasks(("ps",))
    if not ps:
        return {}
    token = uuid.uuid4().hex
    paths = {t: os.path.join(checkpoint_dir, PROBE_NAME.format(f"{t.job}-{t.index}")) for t in ps}
    graph = tf1.Graph()
    with graph.as_default():
        writes = {}
        for t, path in paths.items():
            with tf1.device(t.device + "/device:CPU:0"):
                writes[t] = tf.io.write_file(path, tf.constant(f"{token} {t}"))
    failed = {}
    options = tf1.RunOptions(timeout_in_ms=int(timeout * 1000))
    with tf1.Session(target, graph=graph, config=cluster.session_config()) as session:
        for t, op in writes.items():
            try:
                session.run(op, options=options)
            except tf.errors.DeadlineExceededError:
                failed[t] = f"it did not write within {timeout:g}s"
            except tf.errors.OpError as e:
                failed[t] = (e.message or type(e).__name__).splitlines()[0][:160]
    for t, path in paths.items():
        if t in failed:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                seen = f.read()
            os.remove(path)
        except OSError:
            seen = None
        if seen != f"{token} {t}":
            failed[t] = "its file is not where this task reads (another machine's disk, no shared filesystem)"
    return failed


def checkpoint_saver(sharded: bool, **kwargs):
    """TF's Saver for the chief's checkpoints: paths relative to their dir; ``sharded`` as :func:`sharding` decided."""
    import tensorflow as tf
    return tf.compat.v1.train.Saver(sharded=sharded, save_relative_paths=True, **kwargs)


def sharding(cluster, target: str, checkpoint_dir: str, timeout: float = PROBE_TIMEOUT_SECS) -> bool:
    """Whether the chief's saves are sharded: there are ps tasks and each writes ``checkpoint_dir``; one line says
    which and, when a ps cannot, what is done instead."""
    if cluster is None or not cluster.num_tasks("ps"):
        return False
    import tensorflow as tf
    try:
        failed = ps_cannot_write(cluster, target, checkpoint_dir, timeout)
    except (tf.errors.OpError, OSError) as e:    # a probe that cannot run must not stop training: save whole
        failed = {"a ps": f"the probe failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
    if failed:
        task, why = next(iter(failed.items()))
        log.warning("checkpoints: %s cannot write %s (%s); the chief writes whole checkpoints instead, every "
                    "variable through it (sharded saves need a directory every ps shares: docs/pitfalls.md, item 9)",
                    task, checkpoint_dir, why)
        return False
    log.info("checkpoints: each of %d ps saves its own variables into %s (sharded)", cluster.num_tasks("ps"),
             checkpoint_dir)
    return True
