"""A TF 1.13-1.14 Estimator program that names its strategy in the RunConfig: nothing tfcluster-specific.

    python estimator_allreduce.py --model_dir DIR [--batch 10] [--max_steps 20] [--strategy collective|none]
        [--towers N]

A model_fn of its own (tf.layers, a mean squared error, Momentum with UPDATE_OPS) over fixed data; its
input_fn takes TF 1.14's ``input_context`` and reads its worker's shard of the data (every
``num_input_pipelines``-th row). ``--strategy collective``: ``RunConfig(experimental_distribute=
DistributeConfig(train_distribute=CollectiveAllReduceStrategy(), eval_distribute=MirroredStrategy()))``,
as the public TF 1.x programs of that era wrote it; ``--towers N`` gives it ``num_gpus_per_worker=N``, and the
evaluation ``MirroredStrategy(num_gpus_per_worker=N)``. ``train_and_evaluate`` gives each TF_CONFIG task its
role; the trainers print their final weights as JSON on a line starting with WEIGHTS, the evaluator its
metrics on a line starting with EVAL.
"""

import argparse
import json

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--model_dir", required=True)
p.add_argument("--batch", type=int, default=10)
p.add_argument("--max_steps", type=int, default=20)
p.add_argument("--strategy", choices=("collective", "none"), default="collective")
p.add_argument("--towers", type=int, default=0)
args = p.parse_args()

rng = np.random.RandomState(0)
x = rng.randn(800, 3).astype(np.float32)
y = (x @ np.array([[1.], [-2.], [0.5]], np.float32) + 0.3).astype(np.float32)


def input_fn(mode, input_context=None):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if input_context is not None:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.repeat().batch(args.batch)


def model_fn(features, labels, mode):
    hidden = tf.layers.dense(features, 8, activation=tf.nn.tanh, name="hidden",
                             kernel_initializer=tf.glorot_uniform_initializer(seed=1))
    out = tf.layers.dense(hidden, 1, name="out", kernel_initializer=tf.glorot_uniform_initializer(seed=2))
    loss = tf.losses.mean_squared_error(labels, out)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss,
                                          eval_metric_ops={"mse": tf.metrics.mean_squared_error(labels, out)})
    with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
        train_op = tf.train.MomentumOptimizer(0.05, 0.9).minimize(loss, tf.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


distribute = None
if args.strategy == "collective":
    distribute = tf.contrib.distribute.DistributeConfig(
        train_distribute=tf.contrib.distribute.CollectiveAllReduceStrategy(num_gpus_per_worker=args.towers),
        eval_distribute=tf.contrib.distribute.MirroredStrategy(num_gpus_per_worker=args.towers or None))
config = tf.estimator.RunConfig(experimental_distribute=distribute, save_checkpoints_steps=10)
estimator = tf.estimator.Estimator(model_fn, model_dir=args.model_dir, config=config)
result = tf.estimator.train_and_evaluate(
    estimator, tf.estimator.TrainSpec(input_fn, max_steps=args.max_steps),
    tf.estimator.EvalSpec(input_fn, steps=5, start_delay_secs=0, throttle_secs=0))
if config.task_type == "evaluator":
    print("EVAL " + json.dumps({k: float(v) for k, v in (result[0] if result else {}).items()}), flush=True)
else:
    print("WEIGHTS " + json.dumps({name: estimator.get_variable_value(name).tolist()
                                   for name in ("hidden/kernel", "out/kernel", "out/bias", "global_step")}),
          flush=True)
