"""Where a ps-training step's time goes: traces of a few steps of the bench's model, through tfcluster.fit.

    tfcluster local --ps 1 --workers 2 -- python scripts/bench/profile_step.py --mode sync
    tfcluster local --ps 1 --workers 2 --wire bfloat16 -- python scripts/bench/profile_step.py --model big

Trains the bench's MLP (or the bigger one) with the strategy of ``--mode``,
as the bench's rows do; after ``--warmup`` steps it traces ``--traced`` steps
(FULL_TRACE, as a hook asks for it), then times as many untraced. Each
trainer prints one ``PROFILE <json>`` line and a readable table: its
untraced step time, and per device (this worker, the ps) the milliseconds per
step of each op type, summed over the op's instances (ops overlap, so the
lines add up to more than the step), with the bytes every RecvTensor moved.
In sync mode ``QueueDequeueV2`` on the ps is the time a step waits for the
others (the chief for the gradients, a worker for the chief's update).
"""

import argparse
import collections
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import tfcluster  # noqa: E402

tfcluster.quiet_tensorflow()
import tensorflow as tf  # noqa: E402

from common import MODELS, mlp_logits, synthetic  # noqa: E402
from tfcluster.strategies import ModelOutput  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
p = argparse.ArgumentParser()
p.add_argument("--mode", choices=("async", "sync"), default="async")
p.add_argument("--model", choices=sorted(MODELS), default="mlp")
p.add_argument("--batch", type=int, default=None, help="per-worker batch (default: the model's in the bench)")
p.add_argument("--warmup", type=int, default=50)
p.add_argument("--traced", type=int, default=10)
a = p.parse_args()
hidden, batch = MODELS[a.model]
batch = a.batch or batch
data_x, data_y = synthetic()


def model_fn(features, labels, mode):
    logits = mlp_logits(tf1, features, hidden)
    return ModelOutput(predictions=tf.argmax(logits, 1),
                       per_example_loss=tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices((data_x, data_y)).repeat().batch(ctx.per_replica_batch,
                                                                               drop_remainder=True)


def _kind(node):
    if node.node_name == "RecvTensor":
        return "RecvTensor"
    m = re.search(r"= (\w+)\(", node.timeline_label)
    return m.group(1) if m else node.node_name.split("/")[-1]


class Profile(tfcluster.Hook):
    """Traces steps warmup..warmup+traced, then times as many untraced steps."""

    def __init__(self):
        self.step, self.totals, self.bytes = 0, collections.defaultdict(float), collections.defaultdict(int)
        self.timed = None

    def before_run(self, run_context):
        self.step += 1
        if a.warmup < self.step <= a.warmup + a.traced:
            return tfcluster.RunArgs(fetches=[], options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE))
        if self.step == a.warmup + a.traced + 1:
            self.timed = time.time()
        return None

    def after_run(self, run_context, run_values):
        md = run_values.run_metadata
        if md is not None:
            traffic = tfcluster.step_traffic(md)
            for where in ("ps", "worker"):
                self.bytes[where] += int(traffic.received_by(where))
            for dev in md.step_stats.dev_stats:
                where = "ps" if "/job:ps" in dev.device else "worker"
                for n in dev.node_stats:
                    self.totals[(where, _kind(n))] += (n.op_end_rel_micros or n.all_end_rel_micros) / 1000.0
        if self.timed is not None and self.step == a.warmup + 2 * a.traced:
            self.step_ms = (time.time() - self.timed) / (a.traced - 1) * 1000.0
            run_context.request_stop()

    def report(self, task):
        ops = sorted(((w, k, ms / a.traced) for (w, k), ms in self.totals.items()), key=lambda t: -t[2])[:16]
        doc = dict(task=task, mode=a.mode, model=a.model, batch=batch, wire=os.environ.get("TFCLUSTER_WIRE", "float32"),
                   step_ms=self.step_ms, recv_bytes_per_step={k: v // a.traced for k, v in self.bytes.items()},
                   ops=[dict(device=w, op=k, ms=round(ms, 3)) for w, k, ms in ops])
        print("PROFILE " + json.dumps(doc), flush=True)
        print(f"{task} ({a.mode}, {a.model}, batch {batch}, wire {doc['wire']}): untraced step {self.step_ms:.2f} ms; "
              f"received per step: {', '.join(f'{k} {v / 1e6:.2f} MB' for k, v in doc['recv_bytes_per_step'].items())}")
        print("  ms per step by device and op (summed over the op's instances; ops overlap):")
        for w, k, ms in ops:
            print(f"    {w:<7} {k:<40} {ms:8.3f}")


profile = Profile()
result = tfcluster.fit(model_fn, input_fn, strategy=a.mode, steps=10 ** 6, batch_size=batch,
                       optimizer=lambda: tf1.train.GradientDescentOptimizer(0.01), log_every_secs=1e9,
                       hooks=[profile])
if result is not None:
    profile.report(result.task)
