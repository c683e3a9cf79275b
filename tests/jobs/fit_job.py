"""The training job the fault tests kill, cut and restart: ``python fit_job.py --steps N --ckpt DIR ...``.

It trains a small MLP on fixed random data with ``tfcluster.fit`` in whatever
role TF_CONFIG gives it (ps, worker, or one process without TF_CONFIG), and
logs every step (``worker:0 step 12 (global 30) ...``) so a test can read the
global step a task had reached at the moment of a fault. ``--step-sleep``
slows each step down so that a fault lands mid-run; ``--ballast-mb`` adds a
big untrained variable so that most of the time is spent saving checkpoints;
``--increment-steps`` adds an embedding variable (an id per example) and saves
its increments between the full checkpoints.
"""

import argparse
import os
import sys
import time

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True, help="global step target")
p.add_argument("--ckpt", required=True, help="checkpoint dir (shared by every task)")
p.add_argument("--mode", choices=("async", "sync", "local"), default=None)
p.add_argument("--replicas", type=int, default=None, help="sync: replicas_to_aggregate")
p.add_argument("--save-steps", type=int, default=10)
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--stall-warn", type=float, default=2.0)
p.add_argument("--stall-timeout", type=float, default=None)
p.add_argument("--startup-timeout", type=float, default=60.0)
p.add_argument("--ballast-mb", type=float, default=0.0)
p.add_argument("--keep", type=int, default=3, help="checkpoints kept")
p.add_argument("--save-secs", type=float, default=None, help="save every S seconds instead of --save-steps")
p.add_argument("--step-timeout", type=float, default=60.0, help="a step longer than this: a silent task")
p.add_argument("--increment-steps", type=int, default=None, help="an embedding variable, increments every N steps")
p.add_argument("--chief-timeout", type=float, default=60.0, help="no heartbeat from the chief this long: gone")
args = p.parse_args()

import tensorflow as tf  # noqa: E402

import tfcluster  # noqa: E402
from tfcluster.core.logs import setup_cli_logging  # noqa: E402
from tfcluster.strategies import ModelOutput, ParameterServerStrategy  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
setup_cli_logging()   # TFCLUSTER_DEBUG=1 also shows the debug lines (a save's start)
print(f"pid {os.getpid()} restart {os.environ.get('TFCLUSTER_RESTART_COUNT', '-')}", flush=True)

rng = np.random.RandomState(0)
X = rng.randn(1024, 10).astype("float32")
Y = (X @ rng.randn(10, 3)).argmax(1).astype("int64")


def model_fn(features, labels, mode):
    w1 = tf1.get_variable("w1", initializer=(rng.randn(10, 16) * 0.3).astype("float32"))
    w2 = tf1.get_variable("w2", initializer=(rng.randn(16, 3) * 0.3).astype("float32"))
    if args.ballast_mb:
        n = int(args.ballast_mb * (1 << 20) / 4)
        tf1.get_variable("ballast", shape=[n], initializer=tf1.ones_initializer(), trainable=False)
    logits = tf.matmul(tf.nn.tanh(tf.matmul(features, w1)), w2)
    if args.increment_steps:
        ids = tf.cast(tf.abs(features[:, 0]) * 1000, tf.int64) % 5000
        logits += tfcluster.embedding_lookup(tfcluster.get_embedding_variable("ids", 3), ids)
    loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return ModelOutput(predictions=tf.argmax(logits, 1), per_example_loss=loss)


def input_fn(ctx):
    ds = ctx.shard(tf.data.Dataset.from_tensor_slices((X, Y))).batch(ctx.per_replica_batch, drop_remainder=True)
    if args.step_sleep:
        def slow(x, y):
            t = tf.py_function(lambda: time.sleep(args.step_sleep) or 0.0, [], tf.float32)
            return x + 0.0 * t, y
        ds = ds.map(slow)
    return ds


strategy = args.mode
if args.mode in ("async", "sync"):
    strategy = ParameterServerStrategy(args.mode, replicas_to_aggregate=args.replicas,
                                       stall_warn_secs=args.stall_warn, stall_timeout_secs=args.stall_timeout)
try:
    result = tfcluster.fit(model_fn, input_fn, optimizer=lambda: tf1.train.GradientDescentOptimizer(0.1),
                           steps=args.steps, strategy=strategy, batch_size=16, checkpoint_dir=args.ckpt,
                           save_checkpoint_steps=None if args.save_secs else args.save_steps,
                           save_checkpoint_secs=args.save_secs, summary_steps=None, log_every_secs=0.0,
                           keep_checkpoints=args.keep, startup_timeout=args.startup_timeout,
                           step_timeout_secs=args.step_timeout, chief_timeout_secs=args.chief_timeout,
                           save_incremental_checkpoint_steps=args.increment_steps)
except tfcluster.TfclusterError as e:   # as examples/digits.py: one line and the error's exit code
    print(f"fit_job: error: {e}", file=sys.stderr, flush=True)
    sys.exit(e.exit_code)
if result is not None:
    print(f"finished {result.task}: global step {result.global_step}, {result.local_steps} local step(s)",
          flush=True)
sys.exit(0)
