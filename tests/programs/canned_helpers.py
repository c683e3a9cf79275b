"""A TF 1.x program using the canned estimators' helpers: parsing specs over TFRecords, pandas input,
add_metrics, BestExporter under train_and_evaluate.

    python canned_helpers.py --model_dir DIR

Prints ``RESULT <JSON>``: the parse spec's keys, the metrics of the last evaluation, the best exports kept.
"""

import argparse
import json
import os

import numpy as np
import pandas as pd
import tensorflow as tf

fc = tf.feature_column


def write_examples(path, x, c, y):
    with tf.io.TFRecordWriter(path) as writer:
        for xi, ci, yi in zip(x, c, y):
            feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=[xi])),
                       "c": tf.train.Feature(bytes_list=tf.train.BytesList(value=[ci.encode()])),
                       "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[yi]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    args = p.parse_args()
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, 600).astype(np.float32)
    c = rng.choice(["red", "green", "blue"], 600)
    y = (x + 0.8 * (c == "red") > 0.3).astype(np.int64)        # the colour's embedding and x both matter
    columns = [fc.numeric_column("x"),
               fc.embedding_column(fc.categorical_column_with_vocabulary_list("c", ["red", "green", "blue"]), 2)]
    spec = tf.estimator.classifier_parse_example_spec(columns, label_key="y", label_dtype=tf.int64)
    regression_spec = tf.estimator.regressor_parse_example_spec(columns, label_key="y")
    records = os.path.join(args.model_dir + "_data.tfrecord")
    write_examples(records, x[:200], c[:200], y[:200])

    def eval_input():
        parsed = tf.data.TFRecordDataset(records).batch(100).map(lambda s: tf.io.parse_example(s, spec))
        return parsed.map(lambda f: (f, f.pop("y")))

    def my_auc(labels, predictions):
        return {"my_auc": tf.metrics.auc(labels, predictions["logistic"])}

    estimator = tf.estimator.DNNClassifier([8], columns, model_dir=args.model_dir,
                                           config=tf.estimator.RunConfig(save_checkpoints_steps=100,
                                                                         tf_random_seed=1))
    estimator = tf.estimator.add_metrics(estimator, my_auc)
    frame = pd.DataFrame({"x": x, "c": c})
    train = tf.estimator.inputs.pandas_input_fn(frame, pd.Series(y), batch_size=32, num_epochs=None, shuffle=True)
    serving = tf.estimator.export.build_parsing_serving_input_receiver_fn(fc.make_parse_example_spec(columns))
    exporter = tf.estimator.BestExporter(serving_input_receiver_fn=serving, exports_to_keep=2)
    metrics, _ = tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(train, max_steps=400),
        tf.estimator.EvalSpec(eval_input, steps=None, exporters=[exporter], start_delay_secs=0, throttle_secs=0))
    best = os.path.join(args.model_dir, "export", "best_exporter")
    print("RESULT " + json.dumps({"spec": sorted(spec), "regression_spec": sorted(regression_spec),
                                  "metrics": {k: float(v) for k, v in metrics.items()},
                                  "best_exports": sorted(os.listdir(best)) if os.path.isdir(best) else []}))


if __name__ == "__main__":
    main()
