"""S1/S2 workload: a full save of 2 ps' state, sharded (each ps writes its own variables) against unsharded.

Run as the one trainer of ``tfcluster local --ps 2 --workers 1``. A table of
``BENCH_SAVE_MB`` megabytes and an optimizer-slot-like twin of it are made in
the ps strategy's scope, as a tfcluster model makes them (parts of at most 8 MB,
placed by bytes over both ps). Saves alternate between TF's sharded Saver, the
one tfcluster's chief uses where every ps writes the checkpoint dir
(tfcluster/training/savers.py), and the unsharded one it falls back to; each is
timed from the call to the index on disk, then removed. Restores of the
sharded checkpoint are timed too. It prints the paired seconds.
"""

import os
import shutil
import sys
import tempfile
import time

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
report(dict(workload="saves", sharded_seconds=seconds["sharded"], unsharded_seconds=seconds["unsharded"],
            restore_seconds=restores, state_bytes=2 * rows * 64 * 4))
tfcluster.signal_done(cluster)
