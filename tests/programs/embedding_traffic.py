"""examples/click_through_fit.py's model on a cluster, with what its steps move measured from their traces.

Each trainer prints one ``TRAFFIC <json>`` line: per traced step, the distinct ids its batch touched, the bytes
of those rows (deep and wide: 17 floats a row) and of the dense weights, the bytes this worker received and the
ps tasks received, each task's share, and where the table's parts live (the placement report).
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
import click_through_fit as example  # noqa: E402
import tfcluster  # noqa: E402

import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
TABLES = ("embeddings", "wide")

p = argparse.ArgumentParser()
p.add_argument("--mode", default="async")
p.add_argument("--buckets", type=int, default=50_000)
p.add_argument("--data-dir", required=True)
p.add_argument("--after", type=int, default=15, help="untraced steps first")
p.add_argument("--traced", type=int, default=5)
a = p.parse_args()
tf1.disable_eager_execution()
inner = example.make_model_fn(a.buckets)
distinct = {}


def model_fn(features, labels, mode):
    distinct["ids"] = tf.size(tf.unique(tf.reshape(example.hashed_ids(features, a.buckets), [-1]))[0])
    return inner(features, labels, mode)


traffic = tfcluster.TrafficHook(after=a.after, steps=a.traced)


class Measure(tfcluster.Hook):
    """Fetches the distinct ids on the traced steps, notes the placement, stops after the last traced step."""

    def begin(self):
        traffic.fetches = {"distinct": distinct["ids"]}
        report = tfcluster.placement_report()
        self.parts = {}
        self.dense = 0
        trainable = {v.op.name for v in tf1.trainable_variables()}
        for r in report.records:
            if r.name not in trainable:
                continue        # optimizer slots, sync state
            if r.name.split("/")[0] in TABLES:
                self.parts.setdefault(r.device, []).append(r.name)
            else:
                self.dense += r.nbytes

    def after_run(self, run_context, run_values):
        if traffic.traffic is not None:
            run_context.request_stop()


measure = Measure()
result = tfcluster.fit(model_fn, example.train_input_fn(a.data_dir, 4096), strategy=a.mode, steps=10 ** 6,
                       batch_size=512, optimizer=lambda: tf1.train.AdagradOptimizer(0.05),
                       hooks=[traffic, measure], log_every_secs=1e9)
if result is not None and traffic.traffic is not None:
    t = traffic.traffic
    ids = sum(v["distinct"] for v in traffic.values) / len(traffic.values)
    print("TRAFFIC " + json.dumps(dict(
        task=result.task, distinct=ids, row_bytes=ids * 17 * 4, dense_bytes=measure.dense,
        worker_received=t.received_by(result.task), ps_received=t.received_by("ps"),
        by_task=t.by_task(), parts=measure.parts, largest_to_ps=t.largest(3, "ps"))), flush=True)
