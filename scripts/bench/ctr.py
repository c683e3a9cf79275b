"""tfcluster's side of the click-through bench: examples/click_through_fit.py's wide & deep through tfcluster.fit.

The model is the example's without its training metrics, as its peers train it.

Run under ``tfcluster local`` (TF_CONFIG set). Each worker prints one ``BENCH`` line (examples/s, its step
timeline). With ``--trace N`` it traces N steps after ``--after`` untraced ones (tfcluster.TrafficHook), stops
there, and prints what those steps moved as a ``TRAFFIC`` line too: the distinct ids its batch touched, the
bytes of those rows (deep and wide: 17 floats a row) and of the dense weights, the bytes this worker and the
ps tasks received, each task's share, and where the tables' parts live (the placement report). Bytes come
from the traced steps, never from a model of what should travel.

With ``--checkpoint-dir`` the chief saves every ``--save-steps`` (where embedding variables evict) and, after
training, puts the held-out file's AUC in its ``BENCH`` line (the example's model, metrics included,
restored in this process). ``--drift`` trains on a click stream whose ids keep arriving (scripts/clicklog.py).
``--table-per-column`` gives each column its own deep and wide tables (52 variables of the same rows), as
feature columns make them: what a lookup and an update per table cost against one of every column.
"""

import argparse
import dataclasses
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
import tfcluster  # noqa: E402

tfcluster.quiet_tensorflow()
import click_through_fit as example  # noqa: E402
import tensorflow as tf  # noqa: E402

from common import report  # noqa: E402
from tfcluster import strategies  # noqa: E402

tf1 = tf.compat.v1
TABLES = ("embeddings", "wide")
ROW_FLOATS = 17         # a hashed value's deep row (16) and its wide weight (1)

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--mode", default="async")
p.add_argument("--buckets", type=int, default=100_000, help="hash buckets per column")
p.add_argument("--steps", type=int, default=600, help="global steps (ignored with --trace: it stops after)")
p.add_argument("--batch", type=int, default=512, help="examples per worker and step")
p.add_argument("--examples", type=int, default=100_000, help="training examples over all workers")
p.add_argument("--data-dir", required=True)
p.add_argument("--trace", type=int, default=0, metavar="N", help="trace N steps and stop after them")
p.add_argument("--after", type=int, default=15, help="untraced steps before the traced ones")
p.add_argument("--max-shard-mb", type=float, default=None,
               help="the ps strategy's max_shard_bytes in MB (0: no limit; default: the strategy's)")
p.add_argument("--split-kb", type=float, default=None,
               help="the ps strategy's partition_min_bytes in KB: split variables this big over every ps")
p.add_argument("--embedding-variables", action="store_true",
               help="a row per value in embedding variables (docs/embeddings.md) instead of --buckets hashed rows")
p.add_argument("--filter-freq", type=int, default=0, help="embedding variables: admit a value once seen this often")
p.add_argument("--steps-to-live", type=int, default=None, help="embedding variables: evict rows this stale at saves")
p.add_argument("--drift", type=float, default=0.0, help="new ids an example (scripts/clicklog.py --drift)")
p.add_argument("--lr", type=float, default=0.05, help="Adagrad's learning rate (default 0.05)")
p.add_argument("--accumulator", type=float, default=0.1, help="Adagrad's initial accumulator (default 0.1)")
p.add_argument("--checkpoint-dir", default=None, help="save there, and report the held-out AUC")
p.add_argument("--save-steps", type=int, default=100, help="with --checkpoint-dir: steps between saves")
p.add_argument("--no-prefetch", action="store_true", help="async: do not fetch the next step's rows during this one")
p.add_argument("--table-per-column", action="store_true", help="a deep and a wide table per column (52 variables)")
a = p.parse_args()
tf1.disable_eager_execution()
option = None
if a.embedding_variables:
    option = tfcluster.EmbeddingVariableOption(
        filter_option=tfcluster.CounterFilter(a.filter_freq) if a.filter_freq else None,
        evict_option=tfcluster.GlobalStepEvict(a.steps_to_live) if a.steps_to_live else None)
inner = example.make_model_fn(a.buckets, option=option)
distinct = {}


def per_column_model_fn(features, labels, mode):
    """The example's wide & deep with a table per column and kind: the same rows in 52 variables."""
    ids = example.hashed_ids(features, a.buckets) - tf.constant([i * a.buckets for i in range(example.COLUMNS)],
                                                                tf.int64)
    init = tf1.truncated_normal_initializer(stddev=0.05, seed=1)
    deep, wide = [], []
    for i in range(example.COLUMNS):
        with tf1.variable_scope("embeddings"):
            deep.append(tf.nn.embedding_lookup(tf1.get_variable(f"C{i}", [a.buckets, 16], initializer=init), ids[:, i]))
        with tf1.variable_scope("wide"):
            wide.append(tf.nn.embedding_lookup(tf1.get_variable(f"C{i}", [a.buckets, 1],
                                                                initializer=tf1.zeros_initializer()), ids[:, i]))
    numeric = tf.concat([features[name] for name in example.clicklog.NUMERIC], axis=1)
    h = tf.concat([numeric] + deep, 1)
    for i, units in enumerate((256, 128)):
        h = example.dense(h, units, f"dnn_{i}", tf.nn.relu, seed=2 + i)
    logits = tf.squeeze(example.dense(h, 1, "dnn_logit", seed=9) + tf.add_n(wide)
                        + tf1.get_variable("bias", [1], initializer=tf1.zeros_initializer()), 1)
    clicked = tf.cast(tf.squeeze(labels, 1), tf.float32)
    return example.ModelOutput(predictions=tf.sigmoid(logits),
                               per_example_loss=tf.nn.sigmoid_cross_entropy_with_logits(labels=clicked, logits=logits))


if a.table_per_column:
    inner = per_column_model_fn


def model_fn(features, labels, mode):
    distinct["ids"] = tf.size(tf.unique(tf.reshape(example.hashed_ids(features, a.buckets), [-1]))[0])
    # The peers train without metrics; fit would update the example's AUC (1,000 thresholds) and accuracy
    # every step: ~17 ms of a worker's ~65 ms of op time, and six more variables on a ps (traced, 2026-11-26).
    return dataclasses.replace(inner(features, labels, mode), metrics={})


class Measure(tfcluster.Hook):
    """Fetches the distinct ids on the traced steps, notes the placement, stops after the last traced step."""

    def __init__(self, traffic):
        self.traffic = traffic

    def begin(self):
        self.traffic.fetches = {"distinct": distinct["ids"]}
        report_ = tfcluster.placement_report()
        self.parts, self.dense = {}, 0
        trainable = {v.op.name for v in tf1.trainable_variables()}
        for r in report_.records:
            if r.name not in trainable:
                continue        # optimizer slots, sync state
            if r.name.split("/")[0] in TABLES:
                self.parts.setdefault(r.device, []).append(r.name)
            else:
                self.dense += r.nbytes

    def after_run(self, run_context, run_values):
        if self.traffic.traffic is not None:
            run_context.request_stop()


traffic = tfcluster.TrafficHook(after=a.after, steps=a.trace) if a.trace else None
measure = Measure(traffic) if traffic else None
started = time.time()
strategy = a.mode
if a.max_shard_mb is not None or a.split_kb is not None or a.no_prefetch:
    options = dict(prefetch=False) if a.no_prefetch else {}
    if a.max_shard_mb is not None:
        options["max_shard_bytes"] = int(a.max_shard_mb * 2 ** 20) or None
    if a.split_kb is not None:
        options["partition_min_bytes"] = int(a.split_kb * 1024)
    strategy = strategies.ParameterServerStrategy(a.mode, **options)
saving = dict(checkpoint_dir=a.checkpoint_dir, save_checkpoint_steps=a.save_steps) if a.checkpoint_dir else {}
result = tfcluster.fit(model_fn, example.train_input_fn(a.data_dir, a.examples, a.drift), strategy=strategy,
                       steps=10 ** 6 if a.trace else a.steps, batch_size=a.batch,
                       optimizer=lambda: tf1.train.AdagradOptimizer(a.lr, a.accumulator),
                       hooks=[h for h in (traffic, measure) if h], log_every_secs=1e9, **saving)
if result is not None:
    extra, held_out = {}, {}
    cluster = tfcluster.Cluster.from_tf_config() if os.environ.get("TF_CONFIG") else None
    if a.checkpoint_dir and (cluster is None or cluster.is_chief):       # it wrote the last checkpoint
        tf1.reset_default_graph()
        metrics = tfcluster.evaluate(example.make_model_fn(a.buckets, option=option),
                                     example.eval_input_fn(a.data_dir, a.drift, a.examples), a.checkpoint_dir)
        held_out = dict(auc=float(metrics["auc"]), auc_step=int(metrics["global_step"]))
    if traffic is not None and traffic.traffic is not None:
        t = traffic.traffic
        ids = sum(v["distinct"] for v in traffic.values) / len(traffic.values)
        extra = dict(distinct=ids, row_bytes=ids * ROW_FLOATS * 4, dense_bytes=measure.dense,
                     worker_received=t.received_by(result.task), ps_received=t.received_by("ps"),
                     by_task=t.by_task(), parts=measure.parts, largest_to_ps=t.largest(3, "ps"),
                     ps_ops={task: t.ops_on(task) for task in sorted(t.by_task()) if task.startswith("ps:")},
                     ps_updates={task: t.updates_on(task) for task in sorted(t.by_task()) if task.startswith("ps:")},
                     worker_ops=t.ops_on(result.task),
                     tensors_to_ps=t.tensors(result.task, "ps"), tensors_from_ps=t.tensors("ps", result.task),
                     # Per ps: tensors this worker sent it and received from it, all and those carrying bytes.
                     requests={ps: [t.tensors(result.task, ps), t.tensors(ps, result.task),
                                    t.tensors(result.task, ps, carrying=True), t.tensors(ps, result.task, carrying=True)]
                               for ps in sorted(t.by_task()) if ps.startswith("ps:")})
        print("TRAFFIC " + json.dumps(dict(task=result.task, **extra)), flush=True)
    report(dict(peer=f"tfcluster_{a.mode}", task=result.task, examples_per_sec=result.examples_per_sec,
                steps=result.local_steps, first_step_at=result.first_step_at, last_step_at=result.last_step_at,
                timeline=result.timeline, batch=a.batch, started=started, traffic=extra or None, **held_out))
