"""P7 workload: how fast a worker pulls a large variable from a ps.

Run as a trainer under tfcluster (TF_CONFIG set). The variable is made in the
ps strategy's scope, as a tfcluster model makes it (so in parts of at most
8 MB); a second one is pinned whole to the ps, as plain TF places it. Ops
pinned to this worker force every byte across the wire each pull, and only a
scalar comes back to Python. Pulls of the two alternate.
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
strategy = tfcluster.ParameterServerStrategy("async").bind(cluster)
n = megabytes * (1 << 20) // 4
with strategy.scope():
    sharded = tf1.get_variable("big", [n], initializer=tf1.ones_initializer())
with tf1.device("/job:ps/task:0"):
    whole = tf1.get_variable("whole", [n], initializer=tf1.ones_initializer())


def pull(variable):
    """A scalar that needs every byte of ``variable`` on this worker (a strided read costs no compute)."""
    parts = list(variable) if hasattr(variable, "_get_variable_list") else [variable]  # PartitionedVariable
    with tf1.device(cluster.task.device):
        return tf1.add_n([tf1.reduce_sum(tf1.identity(p)[::4096]) for p in parts])


pulls = {"tfcluster": pull(sharded), "whole": pull(whole)}
rates = {k: [] for k in pulls}
with tf1.Session(server.target, config=cluster.session_config()) as sess:
    sess.run(tf1.global_variables_initializer())
    deadline = time.time() + seconds
    while time.time() < deadline:
        for name, op in pulls.items():
            sess.run(op)  # warm
            count, start = 0, time.time()
            while time.time() - start < 0.5:
                sess.run(op)
                count += 1
            rates[name].append(count * n * 4 / (time.time() - start))
med = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
report(dict(workload="pull", bytes_per_sec=med["tfcluster"], whole_bytes_per_sec=med["whole"],
            parts=len(list(sharded)) if hasattr(sharded, "_get_variable_list") else 1, megabytes=megabytes))
tfcluster.signal_done(cluster)
