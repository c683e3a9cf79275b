"""S1/S2 workload: a full save of 2 ps' state, sharded (each ps writes its own variables) against unsharded.

Run as the one trainer of ``tfcluster local --ps 2 --workers 1``. A table of
``BENCH_SAVE_MB`` megabytes and an optimizer-slot-like twin of it are made in
the ps strategy's scope, as a tfcluster model makes them (parts of at most 8 MB,
placed by bytes over both ps). Saves alternate between TF's sharded Saver, the
one tfcluster's chief uses where every ps writes the checkpoint dir
(tfcluster/training/savers.py), and the unsharded one it falls back to; each is
timed from the call to the index on disk, then removed. Restores of the
sharded checkpoint are timed too. It prints the paired seconds.

Then S3/S4, in a graph of its own: an embedding variable of ``BENCH_EV_ROWS``
ids (dimension 16, Adagrad) split over both ps gets a full sharded save; each
repeat trains 1 % of its ids for one step and saves an increment
(tfcluster/embedding/increments.py), timed and weighed against the full save's
bytes, and the full checkpoint plus its increments is restored, timed.
"""

import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tensorflow as tf  # noqa: E402

import tfcluster  # noqa: E402
from common import report  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
megabytes = int(os.environ.get("BENCH_SAVE_MB", "128"))
repeats = int(os.environ.get("BENCH_SAVE_REPEATS", "4"))

cluster, server = tfcluster.server_from_tf_config(timeout=60)
strategy = tfcluster.ParameterServerStrategy("async").bind(cluster)
rows = megabytes * (1 << 20) // (64 * 4)
with strategy.scope():
    init = tf1.random_uniform_initializer(seed=1)
    table = tf1.get_variable("table", [rows, 64], initializer=init)
    slot = tf1.get_variable("table/Adagrad", [rows, 64], initializer=init)
savers = {"sharded": tf1.train.Saver(sharded=True), "unsharded": tf1.train.Saver(sharded=False)}
seconds = {name: [] for name in savers}
restores = []
out = tempfile.mkdtemp(prefix="tfcbench-saves-")
try:
    with tf1.Session(server.target, config=cluster.session_config()) as sess:
        sess.run(tf1.global_variables_initializer())
        for rep in range(repeats + 1):      # the first pair warms both up, untimed
            for name in (("sharded", "unsharded") if rep % 2 else ("unsharded", "sharded")):
                prefix = os.path.join(out, f"{name}-{rep}")
                t = time.perf_counter()
                savers[name].save(sess, prefix, write_meta_graph=False, write_state=False)
                if rep:
                    seconds[name].append(time.perf_counter() - t)
                if name == "sharded" and rep:
                    t = time.perf_counter()
                    savers[name].restore(sess, prefix)
                    restores.append(time.perf_counter() - t)
                for f in os.listdir(out):
                    if f.startswith(os.path.basename(prefix) + "."):
                        os.remove(os.path.join(out, f))
finally:
    shutil.rmtree(out, ignore_errors=True)


def checkpoint_bytes(prefix):
    """The bytes of checkpoint ``prefix`` on disk (its index and data files)."""
    folder = os.path.dirname(prefix)
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
               if f.startswith(os.path.basename(prefix) + "."))


def embedding_saves():
    """S3/S4 (see the module doc): full and incremental save seconds and bytes, restore seconds, state bytes."""
    from tfcluster.embedding.increments import Increments
    ids_total = int(os.environ.get("BENCH_EV_ROWS", "400000"))
    touched = ids_total // 100
    graph = tf1.Graph()
    with graph.as_default(), strategy.scope():
        step = tf1.train.get_or_create_global_step()
        ev = tfcluster.get_embedding_variable("ev", 16)
        ids = tf1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(tf.square(tfcluster.embedding_lookup(ev, ids) - 1.0))
        train = tf1.train.AdagradOptimizer(0.1).minimize(loss, global_step=step)
        saver = tf1.train.Saver(sharded=True)
        increments = Increments(graph, sharded=True)
        size = tf.add_n([tf.raw_ops.LookupTableSizeV2(table_handle=p.values) for p in ev.parts])
    out = tempfile.mkdtemp(prefix="tfcbench-increments-")
    rng = np.random.RandomState(0)
    result = dict(full_seconds=[], full_bytes=[], increment_seconds=[], increment_bytes=[], restore_seconds=[])
    try:
        with tf1.Session(server.target, graph=graph, config=cluster.session_config()) as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(tf1.local_variables_initializer())     # each ps' copy of the initial matrix, after it
            for start in range(0, ids_total, 50000):
                sess.run(train, {ids: np.arange(start, min(start + 50000, ids_total))})
            result["rows"] = int(sess.run(size))
            for rep in range(repeats):
                t = time.perf_counter()
                full = saver.save(sess, os.path.join(out, "model.ckpt"), global_step=rep * 10,
                                  write_meta_graph=False, write_state=False)
                result["full_seconds"].append(time.perf_counter() - t)
                result["full_bytes"].append(checkpoint_bytes(full))
                sess.run(train, {ids: rng.choice(ids_total, touched, replace=False)})
                t = time.perf_counter()
                increment = increments.save(sess, full, rep * 10 + 1)
                result["increment_seconds"].append(time.perf_counter() - t)
                result["increment_bytes"].append(checkpoint_bytes(increment))
                t = time.perf_counter()
                saver.restore(sess, full)       # the full checkpoint, then its increment
                result["restore_seconds"].append(time.perf_counter() - t)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    result["touched"] = touched
    return result


evs = embedding_saves()
report(dict(workload="saves", sharded_seconds=seconds["sharded"], unsharded_seconds=seconds["unsharded"],
            restore_seconds=restores, state_bytes=2 * rows * 64 * 4, embedding=evs))
tfcluster.signal_done(cluster)
