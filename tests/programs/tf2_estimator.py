"""TF 2.0-2.3's Estimator programs under a strategy (tensorflow.org's guides of that era), on local data.

``--strategy parameter_server``: the distributed-training guide's
``tf.distribute.experimental.ParameterServerStrategy()`` (no cluster resolver:
TF 2.0-2.3 trained only an Estimator with it) in ``RunConfig(train_distribute=...)``,
a canned ``LinearClassifier``. ``--strategy multi_worker``: the "Multi-worker
training with Estimator" tutorial's ``MultiWorkerMirroredStrategy()`` and its
``model_fn`` (a Keras model, ``tf.compat.v1`` loss and optimizer,
``input_fn(mode, input_context)`` sharding by the context). Both end with
``tf.estimator.train_and_evaluate`` and print ``trained: <task>``.
"""
import argparse
import json
import os

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--strategy", choices=["parameter_server", "multi_worker"], required=True)
p.add_argument("--model-dir", required=True)
args = p.parse_args()

if args.strategy == "parameter_server":
    strategy = tf.distribute.experimental.ParameterServerStrategy()
else:
    strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
config = tf.estimator.RunConfig(train_distribute=strategy, model_dir=args.model_dir)

def input_fn(mode, input_context=None):
    rng = np.random.RandomState(0)
    x = rng.rand(256, 4).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 2).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices(({"feats": x}, y))
    if input_context:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.repeat().batch(16)

def model_fn(features, labels, mode):
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)])
    logits = model(features["feats"], training=False)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate=0.1)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
        loss, tf.compat.v1.train.get_or_create_global_step()))

if args.strategy == "parameter_server":
    estimator = tf.estimator.LinearClassifier(feature_columns=[tf.feature_column.numeric_column("feats", shape=(4,))],
                                              config=config)
else:
    estimator = tf.estimator.Estimator(model_fn=model_fn, config=config)
tf.estimator.train_and_evaluate(estimator, tf.estimator.TrainSpec(input_fn=input_fn, max_steps=40),
                                tf.estimator.EvalSpec(input_fn=input_fn, steps=2))
task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
print("trained: {} {}".format(task.get("type"), task.get("index")), flush=True)
