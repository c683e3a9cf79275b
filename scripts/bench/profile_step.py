"""Where a ps-training step's time goes: a full trace of a few steps of the bench MLP.

    tfcluster local --ps 1 --workers 1 -- python scripts/bench/profile_step.py

Builds the bench's model the way tfcluster's async strategy does (variables on
the ps, compute on the worker), runs warm-up steps, traces a few with
RunMetadata, and prints per device the summed time of each op type.
"""

import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tfcluster  # noqa: E402

tfcluster.quiet_tensorflow()
import tensorflow as tf  # noqa: E402

from common import mlp_logits, synthetic  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
cluster, server = tfcluster.server_from_tf_config(timeout=60)
x_np, y_np = synthetic()
with tf1.device(tfcluster.device_setter(cluster)):
    ds = tf.data.Dataset.from_tensor_slices((x_np, y_np)).repeat().batch(128).prefetch(2)
    x, y = tf1.data.make_one_shot_iterator(ds).get_next()
    logits = mlp_logits(tf1, x)
    loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)) / 256.0
    step = tf1.train.get_or_create_global_step()
    train = tf1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=step)
with tf1.Session(server.target, config=cluster.session_config()) as sess:
    sess.run(tf1.global_variables_initializer())
    for _ in range(50):
        sess.run(train)
    t = time.time()
    for _ in range(200):
        sess.run(train)
    per_step = (time.time() - t) / 200
    totals = collections.defaultdict(float)
    traced = 10
    for _ in range(traced):
        md = tf1.RunMetadata()
        sess.run(train, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=md)
        for dev in md.step_stats.dev_stats:
            where = "ps" if "/job:ps" in dev.device else "worker"
            for n in dev.node_stats:
                kind = n.node_name.split(":")[0].split("/")[-1] if n.node_name.startswith("_") else \
                    (n.timeline_label.split("=")[-1].split("(")[0].strip() or n.node_name)
                totals[(where, n.node_name.split("/")[-1].split(":")[0] if "Recv" in n.node_name or
                        "Send" in n.node_name else kind.split("[")[0])] += n.op_end_rel_micros / 1000.0
print(f"untraced step: {per_step * 1000:.2f} ms ({128 / per_step:.0f} examples/s for this one worker)")
print("ms per step by device and op (summed over the op's instances; ops overlap):")
for (where, kind), ms in sorted(totals.items(), key=lambda kv: -kv[1])[:14]:
    print(f"  {where:<7} {kind:<40} {ms / traced:8.3f}")
tfcluster.signal_done(cluster)
