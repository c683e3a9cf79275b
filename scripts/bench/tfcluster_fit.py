"""tfcluster's side of the bench: the same MLP (the bigger one, or the tutorials' CNN) through tfcluster.fit.

Run alone (one process, all cores) or under ``tfcluster local`` (TF_CONFIG set);
``--mode`` picks the strategy. Input is a tf.data pipeline over in-memory arrays.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import tfcluster  # noqa: E402

tfcluster.quiet_tensorflow()
import tensorflow as tf  # noqa: E402

from common import MODELS, mlp_logits, report, synthetic  # noqa: E402
from tfcluster.strategies import ModelOutput  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
p = argparse.ArgumentParser()
p.add_argument("--mode", default=None)
p.add_argument("--model", choices=("mlp", "big", "cnn"), default="mlp")
p.add_argument("--steps", type=int, default=2000, help="global steps")
p.add_argument("--batch", type=int, default=None, help="per-replica batch (default: the model's, 128 or 64)")
p.add_argument("--devices", type=int, default=None, help="towers per process (virtual CPUs without GPUs)")
p.add_argument("--autotune", action="store_true",
               help="the input turns tf.data's autotune on itself (tfcluster then keeps its thread)")
a = p.parse_args()
hidden, default_batch = MODELS.get(a.model, MODELS["mlp"])
a.batch = a.batch or default_batch

data_x, data_y = synthetic()
if a.model == "cnn":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
    from digits import make_model_fn  # noqa: E402
    model_fn = make_model_fn("cnn")
    data_x = data_x.reshape(-1, 28, 28, 1)
else:
    def model_fn(features, labels, mode):
        logits = mlp_logits(tf1, features, hidden)
        return ModelOutput(predictions=tf.argmax(logits, 1),
                           per_example_loss=tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                                         logits=logits))


def input_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((data_x, data_y)).repeat()
    if a.autotune:
        options = tf.data.Options()
        options.autotune.enabled = True
        ds = ds.with_options(options)
    return ds.batch(ctx.per_replica_batch, drop_remainder=True)


started = time.time()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from digits import make_strategy  # noqa: E402

result = tfcluster.fit(model_fn, input_fn, strategy=make_strategy(a.mode, a.devices), steps=a.steps, batch_size=a.batch,
                       optimizer=lambda: tf1.train.GradientDescentOptimizer(0.01), log_every_secs=1e9)
if result is not None:
    # ``batch`` is examples per local step (the timeline counts steps): one batch per tower.
    report(dict(peer=f"tfcluster_{a.mode or 'auto'}", task=result.task, examples_per_sec=result.examples_per_sec,
                steps=result.local_steps, first_step_at=result.first_step_at,
                last_step_at=result.last_step_at, timeline=result.timeline, batch=a.batch * (a.devices or 1), started=started))
