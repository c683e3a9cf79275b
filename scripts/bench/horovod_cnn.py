"""Peer: a Horovod TF 1.x program (Horovod's synthetic benchmark's shape), on tfcluster's horovod.tensorflow.

Run in TF1 mode (``python -m tfcluster.tf1`` or ``tfcluster local --tf1``).
``hvd.init()``, the bench's CNN (the digits example's, as the collective row
trains it through ``tfcluster.fit``), synthetic in-memory data through
tf.data, ``hvd.DistributedOptimizer`` around plain SGD (0.01, as the other
rows), ``BroadcastGlobalVariablesHook(0)`` and a ``MonitoredTrainingSession``
without a target. ``--batch`` is each rank's; ``--fp16`` adds
``Compression.fp16``. Each rank prints one BENCH line.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

from common import Meter, report, synthetic  # noqa: E402
from digits import make_model_fn  # noqa: E402
from tfcluster.strategies import Mode  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=600)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--fp16", action="store_true")
a = p.parse_args()

hvd.init()
data_x, data_y = synthetic(seed=hvd.rank())
dataset = tf.data.Dataset.from_tensor_slices((data_x.reshape(-1, 28, 28, 1), data_y)).repeat()
images, labels = tf.data.make_one_shot_iterator(dataset.batch(a.batch, drop_remainder=True)).get_next()
out = make_model_fn("cnn")(images, labels, Mode.TRAIN)
loss = tf.reduce_mean(out.per_example_loss)
global_step = tf.train.get_or_create_global_step()
opt = hvd.DistributedOptimizer(tf.train.GradientDescentOptimizer(0.01),
                               compression=hvd.Compression.fp16 if a.fp16 else hvd.Compression.none)
train_op = opt.minimize(loss, global_step=global_step)

meter = Meter(a.batch)
started = time.time()
hooks = [hvd.BroadcastGlobalVariablesHook(0), tf.train.StopAtStepHook(last_step=a.steps)]
with tf.train.MonitoredTrainingSession(hooks=hooks) as session:
    while not session.should_stop():
        session.run(train_op)
        meter.step()
report(meter.result(peer="horovod" + ("_fp16" if a.fp16 else ""), task=hvd.rank(), started=started))
