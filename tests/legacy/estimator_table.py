"""A TF 1.x Estimator whose model_fn makes one big embedding table with no partitioner, as most such code did.

    python estimator_table.py --model_dir DIR [--max_steps N]

(under ``tfcluster local --tf1``: ``import tensorflow as tf`` is TF 1.x's API). The model learns one number
per id, the sum of the id's row, for the ids in ``LEARNED``; every other row stays zero. TF 1.x's
``tf.nn.embedding_lookup`` looks the table up with its default ``"mod"`` strategy. Each time model_fn builds
the table it prints ``TABLE <json>`` (mode and the devices of its parts). When training is done, the chief
predicts every id of ``PROBE`` in its own process and prints ``PREDICT <json>``: for each id, its prediction and
the number it learned (0 for an id it never saw).
Do not modernise: it is the TF 1.x code that TF1 mode must run.
"""
import argparse
import json

import numpy as np
import tensorflow as tf

ROWS, DIM = 600000, 4            # 9.6 MB of float32: a table past the 8 MB a ps part holds by default
# Odd and even ids, at both ends: under "mod" over 2 parts id i is row i // 2 of part i % 2, so a restore that
# read the saved table by row would give each of these another id's number.
LEARNED = {1: 1.0, 2: 2.0, 3: 3.0, 299999: 4.0, 300000: 5.0, 300001: 6.0, 599998: 7.0, 599999: 8.0}
PROBE = sorted(LEARNED) + [0, 4, 450000]


def model_fn(features, labels, mode, params, config):
    table = tf.get_variable("table", [ROWS, DIM], initializer=tf.zeros_initializer())
    parts = list(table) if not isinstance(table, tf.Variable) else [table]
    print("TABLE " + json.dumps({"mode": mode, "devices": [v.device for v in parts]}), flush=True)
    prediction = tf.reduce_sum(tf.nn.embedding_lookup(table, features["id"]), axis=1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"id": features["id"], "value": prediction})
    loss = tf.reduce_mean(tf.square(prediction - labels))
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    train_op = tf.train.GradientDescentOptimizer(0.5).minimize(loss, global_step=tf.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def train_input_fn():
    ids = np.array(sorted(LEARNED), np.int64)
    values = np.array([LEARNED[i] for i in ids], np.float32)
    return tf.data.Dataset.from_tensor_slices(({"id": ids}, values)).repeat().batch(len(ids))


def probe_input_fn():
    return tf.data.Dataset.from_tensor_slices({"id": np.array(PROBE, np.int64)}).batch(len(PROBE))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--max_steps", type=int, default=60)
    args = p.parse_args()
    estimator = tf.estimator.Estimator(model_fn, model_dir=args.model_dir,
                                       config=tf.estimator.RunConfig(save_checkpoints_steps=1000))
    tf.estimator.train_and_evaluate(estimator, tf.estimator.TrainSpec(train_input_fn, max_steps=args.max_steps),
                                    tf.estimator.EvalSpec(train_input_fn, steps=1))
    if estimator.config.is_chief:
        predicted = {int(p["id"]): [float(p["value"]), LEARNED.get(int(p["id"]), 0.0)]
                     for p in estimator.predict(probe_input_fn)}
        print("PREDICT " + json.dumps(predicted), flush=True)


if __name__ == "__main__":
    main()
