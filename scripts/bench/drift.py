"""E3 workload: a ps's memory on an id stream that never stops bringing new ids, with eviction.

Run as the one trainer of ``tfcluster local --ps 1 --workers 1``. An embedding
variable (dimension 16, Adagrad, ``GlobalStepEvict(BENCH_DRIFT_TTL)``) is
trained on batches of 4,096 ids drawn from a Zipf law (a = 1.2) whose ranks slide
by ``BENCH_DRIFT_PER_STEP`` ids a step: the popular ids of a step are new a few
hundred steps later, as users and ads come and go. The chief saves every 25
steps (each save evicts). Once the stream is past four eviction horizons (steady
state) the ps's resident memory and row count are read; training goes on until
ten times that many distinct ids have arrived, and they are read again. The ps
is found by the port it listens on (same machine). It prints both readings.
"""

import os
import shutil
import sys
import tempfile

import numpy as np
import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tensorflow as tf  # noqa: E402

import tfcluster  # noqa: E402
from common import report  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
ttl = int(os.environ.get("BENCH_DRIFT_TTL", "100"))
drift = int(os.environ.get("BENCH_DRIFT_PER_STEP", "100"))
BATCH, SAVE_EVERY = 4096, 25

cluster, server = tfcluster.server_from_tf_config(timeout=60)
port = int(cluster.address(cluster.tasks(("ps",))[0]).rsplit(":", 1)[1])
ps = next(psutil.Process(c.pid) for c in psutil.net_connections("tcp")
          if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid)
strategy = tfcluster.ParameterServerStrategy("async").bind(cluster)
with strategy.scope():
    step = tf1.train.get_or_create_global_step()
    option = tfcluster.EmbeddingVariableOption(evict_option=tfcluster.GlobalStepEvict(steps_to_live=ttl))
    ev = tfcluster.get_embedding_variable("ids", 16, ev_option=option)
    ids = tf1.placeholder(tf.int64, [None])
    loss = tf.reduce_sum(tf.square(tfcluster.embedding_lookup(ev, ids) - 1.0))
    train = tf1.train.AdagradOptimizer(0.1).minimize(loss, global_step=step)
    saver = tf1.train.Saver(sharded=True)
    rows = tf.add_n([tf.raw_ops.LookupTableSizeV2(table_handle=p.values) for p in ev.parts])
rng = np.random.RandomState(0)
seen = set()
out = tempfile.mkdtemp(prefix="tfcbench-drift-")
readings = {}
try:
    with tf1.Session(server.target, config=cluster.session_config()) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(tf1.local_variables_initializer())
        t = 0
        while "end" not in readings:
            batch = (np.minimum(rng.zipf(1.2, BATCH), 10 ** 7) + t * drift).astype(np.int64)
            seen.update(batch.tolist())
            sess.run(train, {ids: batch})
            t += 1
            if t % SAVE_EVERY == 0:
                prefix = saver.save(sess, os.path.join(out, "model.ckpt"), global_step=t, write_meta_graph=False,
                                    write_state=False)
                for f in os.listdir(out):
                    os.remove(os.path.join(out, f))
                reading = dict(step=t, ids=len(seen), rows=int(sess.run(rows)), rss=ps.memory_info().rss)
                if "steady" not in readings and t >= 4 * (ttl + SAVE_EVERY):
                    readings["steady"] = reading
                elif "steady" in readings and len(seen) >= 10 * readings["steady"]["ids"]:
                    readings["end"] = reading
finally:
    shutil.rmtree(out, ignore_errors=True)
report(dict(workload="drift", ttl=ttl, drift=drift, **readings))
tfcluster.signal_done(cluster)
