"""Click-through rate on embedding tables split over the ps tasks: TF 1.x's wide & deep over hashed columns.

A TF 1.x program, run by TF1 mode; in one process, or on a cluster unchanged:

    python -m tfcluster.tf1 examples/click_through.py --model_dir /tmp/ctr
    tfcluster local --tf1 --ps 2 --workers 2 --evaluator -- python examples/click_through.py --model_dir /tmp/ctr

The click logs are made here (scripts/clicklog.py: 13 numeric and 26 categorical features, Zipf-distributed
values, a click from a hidden rule), as TFRecord shards, one per trainer, read with ``tf.data`` and
``parse_example``. Each categorical feature is hashed into ``--buckets`` rows and embedded in 16 dimensions (the
deep part) and weighted on its own (the wide part); every table is split over the ps tasks
(``fixed_size_partitioner``), so a step reads and updates only the rows its batch touches. ``train_and_evaluate``
prints the evaluation (AUC, accuracy) where it ran.
"""

import argparse
import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import clicklog  # noqa: E402


def feature_columns(buckets):
    """The wide part (each hashed column's own weights) and the deep part (numeric features, 16-d embeddings)."""
    fc = tf.feature_column
    hashed = [fc.categorical_column_with_hash_bucket(name, buckets) for name in clicklog.CATEGORICAL]
    wide = hashed
    deep = [fc.numeric_column(name) for name in clicklog.NUMERIC] + [fc.embedding_column(c, 16) for c in hashed]
    return wide, deep


def input_fn(paths, batch_size, shuffle, num_epochs):
    """(features, clicked) batches parsed from TFRecord files of tf.Example protos."""
    spec = clicklog.feature_spec()

    def parse(records):
        features = tf.io.parse_example(records, spec)
        return features, features.pop("clicked")

    def make():
        records = tf.data.TFRecordDataset(paths)
        if shuffle:
            records = records.shuffle(20000)
        return records.repeat(num_epochs).batch(batch_size).map(parse).prefetch(2)
    return make


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model_dir", required=True)
    p.add_argument("--data_dir", default=None, help="where the TFRecord files go (default: beside --model_dir)")
    p.add_argument("--buckets", type=int, default=100_000, help="hash buckets per categorical column")
    p.add_argument("--examples", type=int, default=100_000, help="training examples, over all trainers")
    p.add_argument("--train_steps", type=int, default=2000)
    p.add_argument("--batch_size", type=int, default=512)
    args = p.parse_args()
    if args.buckets < 1:
        p.error("--buckets must be at least 1 (got %d)" % args.buckets)
    config = tf.estimator.RunConfig(save_checkpoints_steps=500, tf_random_seed=0)
    trainers = max(config.num_worker_replicas, 1)
    data_dir = args.data_dir or os.path.abspath(args.model_dir).rstrip("/") + "_data"
    # Each task makes only the file it reads: trainer i its shard, the evaluator (or one process) the eval file.
    one_process = not config.cluster_spec.jobs
    train = evaluation = None
    if config.task_type in ("chief", "master", "worker"):
        train = clicklog.write_train(data_dir, config.global_id_in_cluster, trainers, args.examples)
    if config.task_type == "evaluator" or one_process:
        evaluation = clicklog.write_eval(data_dir, 20_000)

    wide, deep = feature_columns(args.buckets)
    partitioner = tf.fixed_size_partitioner(max(config.num_ps_replicas, 1))
    model = tf.estimator.DNNLinearCombinedClassifier(
        model_dir=args.model_dir, linear_feature_columns=wide, dnn_feature_columns=deep,
        dnn_hidden_units=[256, 128], input_layer_partitioner=partitioner, config=config)
    result, _ = tf.estimator.train_and_evaluate(
        model, tf.estimator.TrainSpec(input_fn([train], args.batch_size, True, None), max_steps=args.train_steps),
        tf.estimator.EvalSpec(input_fn([evaluation], 2000, False, 1), steps=None, start_delay_secs=0, throttle_secs=10))
    if result is not None:
        print("click-through at step %d: auc %.4f, accuracy %.4f (baseline %.4f)" % (
            result["global_step"], result["auc"], result["accuracy"], result["accuracy_baseline"]))


if __name__ == "__main__":
    main()
