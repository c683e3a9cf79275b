"""Wide & deep on census-style rows: TF 1.x's DNNLinearCombinedClassifier over feature columns, as legacy code has it.

A TF 1.x program, run by TF1 mode; in one process, or on a cluster unchanged:

    python -m tfcluster.tf1 examples/wide_deep.py --model_dir /tmp/wide_deep
    tfcluster local --tf1 --ps 2 --workers 2 --evaluator -- python examples/wide_deep.py --model_dir /tmp/wide_deep

The data is made here (no download): census-like CSV files in ``--data_dir`` (written once, atomically, so
tasks starting together agree), read back with ``tf.data`` and ``decode_csv`` as TF 1.x's census tutorial did.
Each trainer reads its own shard of the training file. The embedding and the input layer are split over the ps
tasks (``input_layer_partitioner``); ``train_and_evaluate`` prints the evaluation (AUC, accuracy) where it ran.
"""

import argparse
import os

import numpy as np
import tensorflow as tf

COLUMNS = ["age", "hours_per_week", "education", "occupation", "native_country", "clicked"]
DEFAULTS = [[0.0], [0.0], [""], [""], [""], [0]]
EDUCATION = ["Bachelors", "HS-grad", "Masters", "Doctorate", "Some-college", "Assoc-voc"]
OCCUPATIONS = ["Tech-support", "Craft-repair", "Sales", "Exec-managerial", "Prof-specialty", "Other-service"]


def write_csv(path, rows, seed):
    """``rows`` census-like lines and a label from a fixed hidden rule, written atomically to ``path``."""
    if os.path.exists(path):
        return
    rng = np.random.RandomState(seed)
    age = rng.uniform(17, 90, rows)
    hours = rng.uniform(1, 99, rows)
    education = rng.choice(EDUCATION, rows)
    occupation = rng.choice(OCCUPATIONS, rows)
    country = np.array(["country-%d" % i for i in rng.zipf(1.5, rows) % 500])
    score = ((age - 40) / 15 + (hours - 40) / 20 + np.isin(education, ["Masters", "Doctorate"]) * 1.5
             + (occupation == "Exec-managerial") * 1.0 - np.isin(country, ["country-1", "country-2"]) * 0.5)
    clicked = (score + rng.normal(0, 0.5, rows) > 0.5).astype(int)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        for row in zip(age, hours, education, occupation, country, clicked):
            f.write("%.1f,%.1f,%s,%s,%s,%d\n" % row)
    os.replace(tmp, path)


def input_fn(path, batch_size, shuffle, num_epochs, shards=1, index=0):
    """(features, label) batches from a CSV file, this trainer's shard of its lines."""
    def parse(line):
        fields = tf.io.decode_csv(line, record_defaults=DEFAULTS)
        features = dict(zip(COLUMNS, fields))
        return features, features.pop("clicked")

    def make():
        lines = tf.data.TextLineDataset(path).shard(shards, index)
        if shuffle:
            lines = lines.shuffle(10000, seed=index)
        return lines.repeat(num_epochs).batch(batch_size).map(parse)
    return make


def feature_columns():
    """The wide part (sparse columns and a cross) and the deep part (dense columns and embeddings)."""
    fc = tf.feature_column
    age = fc.numeric_column("age", normalizer_fn=lambda x: (x - 50.0) / 20.0)
    hours = fc.numeric_column("hours_per_week", normalizer_fn=lambda x: (x - 50.0) / 30.0)
    education = fc.categorical_column_with_vocabulary_list("education", EDUCATION)
    occupation = fc.categorical_column_with_hash_bucket("occupation", 100)
    country = fc.categorical_column_with_hash_bucket("native_country", 1000)
    age_buckets = fc.bucketized_column(fc.numeric_column("age"), [18, 25, 30, 35, 40, 45, 50, 55, 60, 65])
    wide = [education, occupation, country, age_buckets,
            fc.crossed_column([age_buckets, "education", "occupation"], hash_bucket_size=1000)]
    deep = [age, hours, fc.indicator_column(education), fc.embedding_column(occupation, 8),
            fc.embedding_column(country, 8)]
    return wide, deep


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model_dir", required=True)
    p.add_argument("--data_dir", default=None, help="where the CSV files go (default: beside --model_dir)")
    p.add_argument("--train_steps", type=int, default=2000)
    p.add_argument("--batch_size", type=int, default=64)
    args = p.parse_args()
    data_dir = args.data_dir or os.path.abspath(args.model_dir).rstrip("/") + "_data"
    os.makedirs(data_dir, exist_ok=True)
    train_file, eval_file = os.path.join(data_dir, "train.csv"), os.path.join(data_dir, "eval.csv")
    write_csv(train_file, 20000, seed=0)
    write_csv(eval_file, 4000, seed=1)

    config = tf.estimator.RunConfig(save_checkpoints_steps=500, tf_random_seed=0)
    wide, deep = feature_columns()
    partitions = max(config.num_ps_replicas, 1)
    model = tf.estimator.DNNLinearCombinedClassifier(
        model_dir=args.model_dir, linear_feature_columns=wide, dnn_feature_columns=deep,
        dnn_hidden_units=[64, 32], input_layer_partitioner=tf.fixed_size_partitioner(partitions), config=config)
    trainers = max(config.num_worker_replicas, 1)
    index = config.global_id_in_cluster if config.task_type in ("chief", "master", "worker") else 0
    train = input_fn(train_file, args.batch_size, True, None, trainers, index)
    evaluation = input_fn(eval_file, 500, False, 1)
    result, _ = tf.estimator.train_and_evaluate(
        model, tf.estimator.TrainSpec(train, max_steps=args.train_steps),
        tf.estimator.EvalSpec(evaluation, steps=None, start_delay_secs=0, throttle_secs=5))
    if result is not None:
        print("wide & deep at step %d: auc %.4f, accuracy %.4f (baseline %.4f)" % (
            result["global_step"], result["auc"], result["accuracy"], result["accuracy_baseline"]))


if __name__ == "__main__":
    main()
