"""The job the wire tests run: ``python wire_job.py --mode sync --steps N --ckpt DIR`` under tfcluster local.

A small classifier on fixed random data, with its trainable variables made
three ways: ``tf.compat.v1.get_variable``, ``tf.compat.v1.layers.dense`` and a
tf-keras graph-mode ``Dense`` layer. The wire comes from ``--wire`` or, when
it is not given, from ``TFCLUSTER_WIRE`` (``tfcluster local --wire``). One
steps, the third to the fifth, are traced with their partition graphs; each trainer prints
``TRANSFERS <json>`` for each: every tensor its step sends between tasks with its dtype,
and every tensor received from another task with its bytes (:class:`Transfers`, tfcluster.step_traffic). The chief then prints ``RESULT <json>``: its last loss, the
test accuracy of the checkpoint, and the dtype of every variable in it.
"""

import argparse
import json
import os
import sys

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=("async", "sync"), default="sync")
p.add_argument("--steps", type=int, default=120)
p.add_argument("--ckpt", required=True)
p.add_argument("--wire", default=None)
args = p.parse_args()

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import tfcluster  # noqa: E402
from tfcluster.core.logs import setup_cli_logging  # noqa: E402
from tfcluster.graph.traffic import task_of  # noqa: E402
from tfcluster.strategies import ModelOutput, ParameterServerStrategy  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
setup_cli_logging()

rng = np.random.RandomState(0)
X = rng.randn(2048, 32).astype("float32")
Y = (X @ rng.randn(32, 4)).argmax(1).astype("int64")
X_TEST, Y_TEST = X[:512], Y[:512]


def model_fn(features, labels, mode):
    w = tf1.get_variable("w", [32, 64], initializer=tf1.glorot_uniform_initializer(seed=1))
    h = tf.nn.relu(tf.matmul(features, w))
    h = tf1.layers.dense(h, 64, activation=tf.nn.relu, name="layer",
                         kernel_initializer=tf1.glorot_uniform_initializer(seed=2))
    logits = tf_keras.layers.Dense(4, name="keras", kernel_initializer=tf_keras.initializers.GlorotUniform(3))(h)
    classes = tf.argmax(logits, 1)
    return ModelOutput(predictions=classes,
                       per_example_loss=tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
                       metrics={"accuracy": tf1.metrics.accuracy(labels, classes)})


def input_fn(ctx):
    ds = ctx.shard(tf.data.Dataset.from_tensor_slices((X, Y))).repeat()
    return ds.batch(ctx.per_replica_batch, drop_remainder=True)


def test_input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices((X_TEST, Y_TEST)).batch(256)


class Transfers(tfcluster.Hook):
    """Traces one step with its partition graphs; prints what it sent from one task to another.

    ``sends``: each tensor a partition graph sends to another task, with its
    dtype. ``received``: each RecvTensor of the trace, on the receiving task,
    with its bytes and the tensor it carried.
    """

    def __init__(self, at=(3, 4, 5)):
        self.at, self.seen = at, 0

    def before_run(self, run_context):
        self.seen += 1
        if self.seen in self.at:
            return tfcluster.RunArgs(fetches=[], options=tf1.RunOptions(
                trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True))
        return None

    def after_run(self, run_context, run_values):
        md = run_values.run_metadata
        if md is None or not md.partition_graphs:
            return
        sends = []
        for graph in md.partition_graphs:
            for n in graph.node:
                if n.op in ("_Send", "_HostSend"):
                    src, dst = task_of(n.attr["send_device"].s.decode()), task_of(n.attr["recv_device"].s.decode())
                    if src != dst:
                        sends.append(dict(src=src, dst=dst, dtype=tf.as_dtype(n.attr["T"].type).name, name=n.name))
        received = [dict(dst=t.dst, src=t.src, bytes=t.nbytes, edge=t.tensor)
                    for t in tfcluster.step_traffic(md).transfers]
        print("TRANSFERS " + json.dumps(dict(sends=sends, received=received)), flush=True)


strategy = ParameterServerStrategy(args.mode, wire=args.wire)
result = tfcluster.fit(model_fn, input_fn, optimizer=lambda: tf1.train.GradientDescentOptimizer(0.2),
                       steps=args.steps, strategy=strategy, batch_size=64, checkpoint_dir=args.ckpt,
                       save_checkpoint_steps=None, save_checkpoint_secs=None, summary_steps=None,
                       log_every_secs=1e9, hooks=[Transfers()])
if result is not None and tfcluster.Cluster.from_tf_config().is_chief:
    metrics = tfcluster.evaluate(model_fn, test_input_fn, args.ckpt)
    reader = tf1.train.load_checkpoint(args.ckpt)
    dtypes = {k: tf.as_dtype(v).name for k, v in reader.get_variable_to_dtype_map().items()}
    print("RESULT " + json.dumps(dict(loss=result.loss, accuracy=float(metrics["accuracy"]), dtypes=dtypes,
                                      global_step=result.global_step)), flush=True)
sys.exit(0)
