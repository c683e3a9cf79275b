"""A TF 1.x program giving the *Estimator classes each head of tf.estimator, MultiHead included.

    python canned_heads.py --model_dir DIR

Each head trains a DNNEstimator 150 steps on rows this program makes, evaluates, predicts and is exported and
served from tf.Example strings; it prints ``RESULT <head> <JSON>``: metric names, prediction keys (a MultiHead's
``(head, key)`` pairs as ``head/key``), the serving signatures, what ``serving_default`` gave and the accuracy.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

fc = tf.feature_column


def rows(n):
    rng = np.random.RandomState(3)
    x = rng.uniform(-1, 1, (n, 4)).astype(np.float32)
    tags = np.stack([x[:, 0] > 0, x[:, 1] > 0, x[:, 0] + x[:, 1] > 0], axis=1).astype(np.int64)   # multi-hot
    return {"x": x}, {"class": np.argmax(x[:, :3], axis=1).astype(np.int64)[:, None],
                      "tags": tags, "rate": (1 / (1 + np.exp(-2 * x[:, 2:3]))).astype(np.float32),
                      "score": x.sum(axis=1, keepdims=True)}


HEADS = {
    "MultiClassHead": (lambda: tf.estimator.MultiClassHead(3), "class"),
    "MultiLabelHead": (lambda: tf.estimator.MultiLabelHead(3), "tags"),
    "LogisticRegressionHead": (lambda: tf.estimator.LogisticRegressionHead(), "rate"),
    "MultiHead": (lambda: tf.estimator.MultiHead([tf.estimator.MultiLabelHead(3, name="tags"),
                                                  tf.estimator.RegressionHead(name="score")]), ("tags", "score")),
}


def text(value):
    value = np.asarray(value)
    return value.tolist() if value.dtype != object else [v.decode() for v in value.ravel()]


def served(estimator, export_base):
    spec = fc.make_parse_example_spec([fc.numeric_column("x", shape=[4])])
    path = estimator.export_saved_model(export_base,
                                        tf.estimator.export.build_parsing_serving_input_receiver_fn(spec))
    example = tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5, 0.5, -0.5, 0.1]))})).SerializeToString()
    with tf.Graph().as_default(), tf.Session() as session:
        loaded = tf.saved_model.loader.load(session, ["serve"], path.decode())
        default = loaded.signature_def["serving_default"]
        got = session.run({k: v.name for k, v in default.outputs.items()},
                          {list(default.inputs.values())[0].name: [example]})
    return sorted(loaded.signature_def), default.method_name, {k: text(v) for k, v in got.items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    args = p.parse_args()
    x, labels = rows(1000)
    for name, (head, label) in HEADS.items():
        y = {k: labels[k] for k in label} if isinstance(label, tuple) else labels[label]
        estimator = tf.estimator.DNNEstimator(head(), [16], [fc.numeric_column("x", shape=[4])],
                                              model_dir=os.path.join(args.model_dir, name),
                                              optimizer=tf.keras.optimizers.Adagrad(0.3),
                                              config=tf.estimator.RunConfig(tf_random_seed=1))
        estimator.train(tf.estimator.inputs.numpy_input_fn(x, y, batch_size=50, num_epochs=None, shuffle=True),
                        steps=150)
        metrics = estimator.evaluate(tf.estimator.inputs.numpy_input_fn(x, y, batch_size=500, shuffle=False))
        first = next(estimator.predict(tf.estimator.inputs.numpy_input_fn(x, batch_size=10, shuffle=False)))
        signatures, method, outputs = served(estimator, os.path.join(args.model_dir, name, "export"))
        print("RESULT %s %s" % (name, json.dumps({
            "metrics": {k: float(v) for k, v in metrics.items()},
            "prediction": sorted("/".join(k) if isinstance(k, tuple) else k for k in first),
            "signatures": signatures, "method": method, "outputs": outputs})), flush=True)


if __name__ == "__main__":
    main()
