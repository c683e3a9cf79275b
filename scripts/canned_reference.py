"""Reference model directories written by TF 1.x's own canned estimators, for tests/test_canned_checkpoints.py.

    python scripts/canned_reference.py write DIR      # train each model below, save its checkpoint and predictions
    python scripts/canned_reference.py predict DIR OUT.json   # TF 1.x's estimator predicting from DIR's models

Both run tensorflow-estimator 2.15 with its *own* ``Estimator`` (tfcluster/estimator/canned.py loads it with
``own_estimator=True``: the package's top-level ``__init__`` skipped, as it no longer imports on TF 2.21), in one
plain process, as TF 1.x trained them. ``write`` made the fixtures in tests/fixtures/canned once (each model dir:
its last checkpoint, ``checkpoint``, and ``predictions.json`` of the rows :func:`rows` makes); ``predict`` is how
the tests ask TF 1.x's estimator what a checkpoint tfcluster wrote predicts.
"""

import json
import os
import shutil
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

#: The models: each a kind of TF 1.x canned estimator and the columns legacy programs gave it.
MODELS = ["dnn", "linear_ftrl", "wide_deep", "dnn_regressor"]


def rows(n=64, seed=7):
    """Census-like rows: age, hours, education (vocabulary), city (hash bucket), occupation (identity)."""
    rng = np.random.RandomState(seed)
    x = {"age": rng.uniform(17, 90, n).astype(np.float32),
         "hours": rng.uniform(1, 99, n).astype(np.float32),
         "education": rng.choice(["Bachelors", "HS-grad", "Masters", "Doctorate"], n),
         "city": np.array(["city%d" % i for i in rng.randint(0, 40, n)]),
         "occupation": rng.randint(0, 10, n).astype(np.int64)}
    score = (x["age"] - 40) / 20 + (x["hours"] - 40) / 30 + (x["occupation"] % 3 == 0)
    return x, (score > 0.5).astype(np.int64), score.astype(np.float32)


def build(tf, estimator, name, model_dir, **more):
    """The model ``name`` as ``estimator`` (a ``tf.estimator`` namespace: TF 1.x's or tfcluster's) makes it;
    ``more``: further arguments to its class."""
    fc = tf.compat.v1.feature_column
    age, hours = fc.numeric_column("age"), fc.numeric_column("hours")
    education = fc.categorical_column_with_vocabulary_list("education", ["Bachelors", "HS-grad", "Masters",
                                                                         "Doctorate"])
    city = fc.categorical_column_with_hash_bucket("city", 50)
    occupation = fc.categorical_column_with_identity("occupation", 10)
    ages = fc.bucketized_column(age, [30, 45, 60])
    config = estimator.RunConfig(tf_random_seed=3)
    deep = [age, hours, fc.indicator_column(education), fc.embedding_column(city, 4)]
    if name == "dnn":
        return estimator.DNNClassifier([8, 4], deep, model_dir=model_dir, n_classes=3, config=config, **more)
    if name == "linear_ftrl":
        return estimator.LinearClassifier([education, city, occupation, ages], model_dir=model_dir,
                                          optimizer="Ftrl", config=config)
    if name == "wide_deep":
        wide = [education, occupation, ages, fc.crossed_column([ages, "education"], 30), city]
        return estimator.DNNLinearCombinedClassifier(model_dir=model_dir, linear_feature_columns=wide,
                                                     dnn_feature_columns=deep, dnn_hidden_units=[8, 4],
                                                     config=config)
    if name == "dnn_regressor":
        return estimator.DNNRegressor([8], deep, model_dir=model_dir, optimizer="Adam", config=config)
    raise SystemExit("unknown model " + name)


def input_fns(tf, estimator, name):
    """(train input, predict input) over :func:`rows`."""
    x, y, score = rows(400, seed=1)
    labels = score if name == "dnn_regressor" else np.minimum(y + (x["occupation"] % 5 == 0), 2 if name == "dnn"
                                                             else 1)
    numpy_input_fn = estimator.inputs.numpy_input_fn
    train = numpy_input_fn(x, labels, batch_size=32, num_epochs=None, shuffle=True)
    return train, numpy_input_fn(rows()[0], batch_size=16, shuffle=False)


def predictions(estimator, predict_input) -> list:
    """Every prediction as JSON-able lists."""
    out = []
    for p in estimator.predict(predict_input):
        out.append({k: np.asarray(v).tolist() for k, v in p.items() if np.asarray(v).dtype != object})
    return out


def tf1_estimator():
    """TF 1.x's ``tf.estimator`` (tensorflow-estimator's own Estimator under its canned classes) and ``tf``."""
    import tensorflow as tf
    from tfcluster.estimator import canned
    tf.compat.v1.disable_v2_behavior()
    canned.package(own_estimator=True)
    import importlib
    root = "tensorflow_estimator.python.estimator"
    namespace = type("TF1Estimator", (), {})()
    for name in ("DNNClassifier", "LinearClassifier", "DNNLinearCombinedClassifier", "DNNRegressor"):
        setattr(namespace, name, canned.get(name))
    namespace.RunConfig = importlib.import_module(root + ".run_config").RunConfig
    namespace.inputs = importlib.import_module(root + ".inputs.numpy_io")
    return tf, namespace


def write(base):
    tf, estimator = tf1_estimator()
    for name in MODELS:
        model_dir = os.path.join(base, name)
        shutil.rmtree(model_dir, ignore_errors=True)
        model = build(tf, estimator, name, model_dir)
        train, predict = input_fns(tf, estimator, name)
        model.train(train, steps=60)
        with open(os.path.join(model_dir, "predictions.json"), "w") as f:
            json.dump(predictions(model, predict), f)
        # Only what a restore reads: the last checkpoint's variables and a state file naming it.
        last = os.path.basename(tf.train.latest_checkpoint(model_dir))
        keep = {"predictions.json", last + ".index", last + ".data-00000-of-00001"}
        with open(os.path.join(model_dir, "checkpoint.new"), "w") as f:
            f.write(f'model_checkpoint_path: "{last}"\nall_model_checkpoint_paths: "{last}"\n')
        os.replace(os.path.join(model_dir, "checkpoint.new"), os.path.join(model_dir, "checkpoint"))
        keep.add("checkpoint")
        for f in os.listdir(model_dir):
            path = os.path.join(model_dir, f)
            if f not in keep:
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        print(name, sorted(os.listdir(model_dir)))


def predict(base, out):
    tf, estimator = tf1_estimator()
    got = {}
    for name in MODELS:
        if os.path.isdir(os.path.join(base, name)):
            _, predict_input = input_fns(tf, estimator, name)
            got[name] = predictions(build(tf, estimator, name, os.path.join(base, name)), predict_input)
    with open(out, "w") as f:
        json.dump(got, f)


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        write(sys.argv[2])
    elif sys.argv[1:2] == ["predict"]:
        predict(*sys.argv[2:4])
    else:
        raise SystemExit(__doc__)
