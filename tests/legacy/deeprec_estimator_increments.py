"""DeepRec's Estimator with incremental checkpoints, as its docs/docs_en/Incremental-Checkpoint.md writes it.

``tf.train.Saver`` and ``tf.train.Scaffold`` with ``incremental_save_restore=True``, and a chief
``tf.train.CheckpointSaverHook`` with ``incremental_save_secs``, around a model of one embedding variable
(``tf.get_embedding_variable``) trained with Adagrad. Each step sleeps 20 ms so that increments (every
second) fall between the full checkpoints (every 100 steps). Prints ``FINAL <json>``: the global step and the
prediction for a few ids, made from the latest checkpoint and its increments. Do not modernise: it is the
DeepRec code that TF1 mode must run.
"""
import argparse
import json
import time

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--model_dir", required=True)
p.add_argument("--steps", type=int, default=250)
args = p.parse_args()


def model_fn(features, labels, mode, params):
    ev = tf.get_embedding_variable("ids", embedding_dim=4, ev_option=tf.EmbeddingVariableOption(
        filter_option=tf.CounterFilter(filter_freq=2)))
    logits = tf.reduce_sum(tf.nn.embedding_lookup(ev, features["id"]), 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logit": logits})
    loss = tf.reduce_mean(tf.square(logits - labels))
    train_op = tf.train.AdagradOptimizer(0.1).minimize(loss, global_step=tf.train.get_global_step())
    scaffold = tf.train.Scaffold(saver=tf.train.Saver(sharded=True, incremental_save_restore=True),
                                 incremental_save_restore=True)
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, train_op=train_op, scaffold=scaffold,
        training_chief_hooks=[tf.train.CheckpointSaverHook(checkpoint_dir=params["model_dir"], save_steps=100,
                                                           scaffold=scaffold, incremental_save_secs=1)])


class Slow(tf.train.SessionRunHook):
    def after_run(self, run_context, run_values):
        time.sleep(0.02)


def train_input():
    ids = np.random.RandomState(0).randint(0, 50, 4000)
    return tf.data.Dataset.from_tensor_slices(({"id": ids}, (ids % 3).astype(np.float32))).repeat().batch(16)


estimator = tf.estimator.Estimator(model_fn, model_dir=args.model_dir, params={"model_dir": args.model_dir},
                                   config=tf.estimator.RunConfig(save_checkpoints_steps=100))
estimator.train(train_input, steps=args.steps, hooks=[Slow()])
asked = np.arange(6)
predicted = [float(p["logit"]) for p in estimator.predict(
    lambda: tf.data.Dataset.from_tensor_slices({"id": asked}).batch(6))]
print("FINAL " + json.dumps({"step": int(estimator.get_variable_value("global_step")), "logits": predicted}))
