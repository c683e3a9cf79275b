"""TF 1.x programs of the canned estimators over feature columns, as legacy codebases wrote them.

    python canned.py --model_dir DIR --estimator NAME [NAME ...] [--steps N] [--export]
    python canned.py --model_dir DIR --estimator NAME --max_steps N [--partitions P] [--log_steps N]
        [--stop_above ACCURACY]   (on a cluster)

Each estimator trains on census-like rows this program makes (age, hours, education as a vocabulary, city as
a hash bucket, their cross, an occupation id), evaluates and predicts; it prints ``RESULT <name> <JSON>`` with
its metrics, one prediction's keys and values, and with ``--export`` what its SavedModel's ``serving_default``
gives for two serialized tf.Example protos. On a cluster (TF_CONFIG), the first estimator trains with ``train_and_evaluate``
(``wide_deep``: a ``DNNLinearCombinedClassifier`` whose input layer, embeddings included, ``input_layer_partitioner``
splits into ``--partitions`` parts); trainers print ``STEPS <task> <local steps>``, an evaluator ``EVAL <JSON>``, and
the chief, once trained, exports the model and prints ``SERVED <JSON>``.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

fc = tf.feature_column
EDUCATION = ["Bachelors", "HS-grad", "Masters", "Doctorate", "Some-college"]


def rows(n, seed=0):
    rng = np.random.RandomState(seed)
    x = {"age": rng.uniform(17, 90, n).astype(np.float32),
         "hours": rng.uniform(1, 99, n).astype(np.float32),
         "education": rng.choice(EDUCATION, n),
         "city": np.array(["city%d" % i for i in rng.randint(0, 40, n)]),
         "occupation": rng.randint(0, 10, n).astype(np.int64)}
    score = ((x["age"] - 40) / 20 + (x["hours"] - 40) / 30 + np.isin(x["education"], EDUCATION[2:4]) * 1.5
             + (x["occupation"] % 3 == 0) - 0.5)
    return x, (score > 1.2).astype(np.int64), score.astype(np.float32)     # about half the rows click


def columns():
    age = fc.numeric_column("age", normalizer_fn=lambda x: (x - 50) / 20)
    hours = fc.numeric_column("hours", normalizer_fn=lambda x: (x - 50) / 30)
    education = fc.categorical_column_with_vocabulary_list("education", EDUCATION)
    city = fc.categorical_column_with_hash_bucket("city", 100)
    occupation = fc.categorical_column_with_identity("occupation", 10)
    ages = fc.bucketized_column(fc.numeric_column("age"), [25, 35, 45, 55, 65])
    wide = [education, city, occupation, ages, fc.crossed_column([ages, "education"], 50)]
    deep = [age, hours, fc.indicator_column(education), fc.indicator_column(occupation),
            fc.embedding_column(city, 8)]
    return wide, deep


def make(name, model_dir, config=None, partitions=None):
    wide, deep = columns()
    est = tf.estimator
    common = dict(model_dir=model_dir, config=config)
    if name == "DNNClassifier":
        return est.DNNClassifier([16, 8], deep, n_classes=2, **common)
    if name == "DNNRegressor":
        return est.DNNRegressor([16, 8], deep, optimizer="Adam", **common)
    if name == "DNNEstimator":
        # TF 1.x's v1 *Estimator classes take tf.contrib.estimator's heads.
        return est.DNNEstimator(tf.contrib.estimator.binary_classification_head(), [16, 8], deep, **common)
    if name == "LinearClassifier":
        return est.LinearClassifier(wide, optimizer="Ftrl", **common)
    if name == "LinearRegressor":
        return est.LinearRegressor(wide + deep[:2], **common)
    if name == "LinearEstimator":
        return est.LinearEstimator(tf.contrib.estimator.regression_head(), wide + deep[:2], **common)
    if name in ("DNNLinearCombinedClassifier", "wide_deep"):
        partitioner = partitions and tf.fixed_size_partitioner(partitions)
        return est.DNNLinearCombinedClassifier(linear_feature_columns=wide, dnn_feature_columns=deep,
                                               dnn_hidden_units=[16, 8], input_layer_partitioner=partitioner,
                                               **common)
    if name == "DNNLinearCombinedRegressor":
        return est.DNNLinearCombinedRegressor(linear_feature_columns=wide, dnn_feature_columns=deep,
                                              dnn_hidden_units=[16, 8], **common)
    if name == "DNNLinearCombinedEstimator":
        # tf.contrib.estimator's heads average the loss over the batch: optimizers given as instances, faster.
        return est.DNNLinearCombinedEstimator(tf.contrib.estimator.multi_class_head(3), linear_feature_columns=wide,
                                              linear_optimizer=tf.train.FtrlOptimizer(0.5), dnn_feature_columns=deep,
                                              dnn_optimizer=tf.train.AdagradOptimizer(0.3), dnn_hidden_units=[16, 8],
                                              **common)
    # The v2 heads (tf.estimator.BinaryClassHead...) take the v2 estimators' optimizers: a name or a tf.keras one.
    if name == "DNNEstimator+BinaryClassHead":
        return est.DNNEstimator(est.BinaryClassHead(), [16, 8], deep, optimizer=tf.keras.optimizers.Adagrad(0.3),
                                **common)
    if name == "LinearEstimator+RegressionHead":
        return est.LinearEstimator(est.RegressionHead(), wide + deep[:2], optimizer="Ftrl", **common)
    if name == "DNNLinearCombinedEstimator+PoissonRegressionHead":
        return est.DNNLinearCombinedEstimator(est.PoissonRegressionHead(), linear_feature_columns=wide,
                                              dnn_feature_columns=deep, dnn_hidden_units=[16, 8], **common)
    if name == "BaselineClassifier":
        return est.BaselineClassifier(n_classes=2, **common)
    if name == "BaselineRegressor":
        return est.BaselineRegressor(**common)
    if name == "BaselineEstimator":
        return est.BaselineEstimator(tf.contrib.estimator.binary_classification_head(), **common)
    raise SystemExit("unknown estimator " + name)


def regression(name):
    return "Regressor" in name or "RegressionHead" in name or name in ("LinearEstimator",)


def targets(name, y, score):
    """The labels ``name`` learns: counts for a Poisson head, the score for a regression, else the click."""
    return np.abs(score) if "Poisson" in name else score if regression(name) else y


def serve(estimator, name, export_base):
    wide, deep = columns()
    spec = fc.make_parse_example_spec(wide + deep)
    path = estimator.export_saved_model(export_base,
                                        tf.estimator.export.build_parsing_serving_input_receiver_fn(spec))
    examples = []
    for age, education in ((30.0, "HS-grad"), (60.0, "Doctorate")):
        feature = {"age": tf.train.Feature(float_list=tf.train.FloatList(value=[age])),
                   "hours": tf.train.Feature(float_list=tf.train.FloatList(value=[50.0])),
                   "education": tf.train.Feature(bytes_list=tf.train.BytesList(value=[education.encode()])),
                   "city": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"city3"])),
                   "occupation": tf.train.Feature(int64_list=tf.train.Int64List(value=[3]))}
        examples.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    with tf.Graph().as_default(), tf.Session() as session:
        loaded = tf.saved_model.loader.load(session, ["serve"], path.decode() if isinstance(path, bytes) else path)
        signatures = loaded.signature_def
        default = signatures["serving_default"]
        name_in = list(default.inputs.keys())[0]
        fetch = {k: v.name for k, v in default.outputs.items()}
        got = session.run(fetch, {default.inputs[name_in].name: examples})
    return {"signatures": sorted(signatures), "method": default.method_name,
            "outputs": {k: np.asarray(v).tolist() if np.asarray(v).dtype != object
                        else [[b.decode() for b in row] for row in np.asarray(v).tolist()]
                        for k, v in got.items()}}


def one_process(name, model_dir, steps, export):
    x, y, score = rows(2000)
    labels = targets(name, y, score)
    estimator = make(name, model_dir, tf.estimator.RunConfig(tf_random_seed=1))
    train = tf.estimator.inputs.numpy_input_fn(x, labels, batch_size=64, num_epochs=None, shuffle=True)
    estimator.train(train, steps=steps)
    metrics = estimator.evaluate(tf.estimator.inputs.numpy_input_fn(x, labels, batch_size=500, shuffle=False))
    first = next(estimator.predict(tf.estimator.inputs.numpy_input_fn(x, batch_size=10, shuffle=False)))
    out = {"metrics": {k: float(v) for k, v in metrics.items()},
           "prediction": {k: np.asarray(v).tolist() if np.asarray(v).dtype != object
                          else [b.decode() for b in np.asarray(v).ravel()] for k, v in first.items()},
           "variables": estimator.get_variable_names()}
    if export:
        out["serving"] = serve(estimator, name, os.path.join(model_dir, "export"))
    print("RESULT %s %s" % (name, json.dumps(out)), flush=True)


class StepCounter(tf.train.SessionRunHook):
    def __init__(self):
        self.steps = 0

    def after_run(self, run_context, run_values):
        self.steps += 1


def on_cluster(name, model_dir, max_steps, partitions, log_steps, stop_above):
    config = tf.estimator.RunConfig(save_checkpoints_steps=100, log_step_count_steps=log_steps)
    estimator = make(name, model_dir, config, partitions)
    x, y, score = rows(4000, seed=config.task_id + 1)
    labels = targets(name, y, score)
    hooks = [StepCounter()]
    if stop_above is not None:       # TF 1.x's early stopping: the chief stops all once the evaluator's accuracy is
        hooks.append(tf.estimator.experimental.stop_if_higher_hook(estimator, "accuracy", stop_above,
                                                                   run_every_secs=None, run_every_steps=20))
    train = tf.estimator.inputs.numpy_input_fn(x, labels, batch_size=64, num_epochs=None, shuffle=True)
    result, _ = tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(train, max_steps=max_steps, hooks=hooks),
        tf.estimator.EvalSpec(tf.estimator.inputs.numpy_input_fn(x, labels, batch_size=500, shuffle=False),
                              steps=None, start_delay_secs=0, throttle_secs=1))
    if config.task_type in ("chief", "master", "worker"):
        print("STEPS %s:%d %d" % (config.task_type, config.task_id, hooks[0].steps), flush=True)
    if config.is_chief:
        print("SERVED " + json.dumps(serve(estimator, name, os.path.join(model_dir, "export"))), flush=True)
    if result is not None:
        print("EVAL " + json.dumps({k: float(v) for k, v in result.items()}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--estimator", nargs="+", required=True)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--max_steps", type=int, default=400)
    p.add_argument("--partitions", type=int)
    p.add_argument("--log_steps", type=int, default=100)
    p.add_argument("--stop_above", type=float, help="stop early once the evaluated accuracy is above this")
    p.add_argument("--export", action="store_true")
    args = p.parse_args()
    if os.environ.get("TF_CONFIG"):
        return on_cluster(args.estimator[0], args.model_dir, args.max_steps, args.partitions, args.log_steps,
                          args.stop_above)
    for name in args.estimator:
        one_process(name, os.path.join(args.model_dir, name), args.steps, args.export)


if __name__ == "__main__":
    main()
