"""P7 workload: how fast a worker pulls a large variable from a ps through tfcluster.

Run as a trainer under tfcluster (TF_CONFIG set). The variable lives on the ps;
a reduction pinned to this worker forces the whole tensor across the wire each
step, and only a scalar comes back to Python.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tensorflow as tf  # noqa: E402

import tfcluster  # noqa: E402
from common import report  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
megabytes = int(os.environ.get("BENCH_PULL_MB", "64"))
seconds = float(os.environ.get("BENCH_SECONDS", "5"))

cluster, server = tfcluster.server_from_tf_config(timeout=60)
n = megabytes * (1 << 20) // 4
with tf1.device("/job:ps/task:0"):
    v = tf1.get_variable("big", [n], initializer=tf1.ones_initializer())
with tf1.device(cluster.task.device):
    # identity on the worker device would be elided; a sum must read every byte here.
    pulled = tf1.reduce_sum(tf1.identity(v))
with tf1.Session(server.target, config=cluster.session_config()) as sess:
    sess.run(v.initializer)
    sess.run(pulled)
    pulls, start = 0, time.time()
    while time.time() - start < seconds:
        sess.run(pulled)
        pulls += 1
    elapsed = time.time() - start
report(dict(workload="pull", bytes_per_sec=pulls * n * 4 / elapsed, pulls=pulls, megabytes=megabytes))
tfcluster.signal_done(cluster)
