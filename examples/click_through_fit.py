"""Click-through rate with tfcluster.fit: wide & deep over one hashed embedding table split over the ps tasks.

    python examples/click_through_fit.py                        # one process
    tfcluster local --ps 2 --workers 2 -- python examples/click_through_fit.py --mode async
    tfcluster local --ps 2 --workers 2 -- python examples/click_through_fit.py --mode sync --buckets 1000000
    tfcluster local --ps 2 --workers 2 -- python examples/click_through_fit.py --embedding-variables --filter-freq 2
    tfcluster local --ps 2 --workers 2 -- python examples/click_through_fit.py --drift 0.5 --examples 512000 \
        --steps 1000 --embedding-variables --filter-freq 2 --steps-to-live 100

The click logs are made here (scripts/clicklog.py: 13 numeric and 26 categorical features, Zipf-distributed
values, a click from a hidden rule), one TFRecord shard per trainer, read with ``tf.data`` and
``parse_example``. Each categorical value is hashed into ``--buckets`` rows of its column's range in one
table of ``26 x buckets`` rows: 16 numbers per row for the deep part, one weight for the wide part. The
tables are big and each step touches a few thousand rows: tfcluster splits them into parts over the ps
tasks (``docs/embeddings.md``), the lookup gathers each part's rows on its ps, and only those rows and
their gradients cross the wire. With ``--embedding-variables`` each value gets a row of its own instead, in
embedding variables on the ps (once seen ``--filter-freq`` times; dropped at a save once untouched for
``--steps-to-live`` steps). With ``--drift`` the log is a stream whose ids keep arriving, read once in order
when ``--examples`` covers the steps (global steps x batch; x workers in sync), and evaluated on what comes
after it. Prints the AUC on the held-out file where the evaluation ran.
"""

import argparse
import os
import sys

import tfcluster

tfcluster.quiet_tensorflow()  # before TensorFlow loads: its C++ logs stay quiet
import tensorflow as tf  # noqa: E402

from tfcluster import Mode, ModelOutput, strategies  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import clicklog  # noqa: E402

tf1 = tf.compat.v1
COLUMNS = len(clicklog.CATEGORICAL)


def hashed_ids(features, buckets):
    """[batch, 26] row ids: each column's strings hashed into its own range of ``buckets`` rows."""
    strings = tf.concat([features[name] for name in clicklog.CATEGORICAL], axis=1)
    offsets = tf.constant([i * buckets for i in range(COLUMNS)], tf.int64)
    return tf.strings.to_hash_bucket_fast(strings, buckets) + offsets


def dense(x, units, name, activation=None, seed=None):
    """A fully connected layer of its own variables (``tf.compat.v1.layers`` needs tf-keras)."""
    with tf1.variable_scope(name):
        w = tf1.get_variable("kernel", [x.shape[-1], units], initializer=tf1.glorot_uniform_initializer(seed=seed))
        y = tf.matmul(x, w) + tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
        return activation(y) if activation else y


def embedding_variable_ids(features):
    """[batch, 26] int64 ids, one per value of every column (its 64-bit hash): no vocabulary, no shared rows."""
    strings = tf.concat([features[name] for name in clicklog.CATEGORICAL], axis=1)   # "C3:..." names its column
    return tf.strings.to_hash_bucket_fast(strings, 2 ** 62)


def make_model_fn(buckets, dimension=16, hidden=(256, 128), option=None):
    """Wide & deep: one weight per hashed value plus a DNN over the numeric features and 16-d embeddings;
    ``option`` (an EmbeddingVariableOption): a row per value in embedding variables instead of hashed tables."""
    def model_fn(features, labels, mode):
        init = tf1.truncated_normal_initializer(stddev=0.05, seed=1)
        if option is None:
            ids = hashed_ids(features, buckets)
            table = tf1.get_variable("embeddings", [COLUMNS * buckets, dimension], initializer=init)
            wide_table = tf1.get_variable("wide", [COLUMNS * buckets, 1], initializer=tf1.zeros_initializer())
            lookup = tf.nn.embedding_lookup
        else:
            ids = embedding_variable_ids(features)
            table = tfcluster.get_embedding_variable("embeddings", dimension, initializer=init, ev_option=option)
            wide_table = tfcluster.get_embedding_variable("wide", 1, initializer=tf1.zeros_initializer(),
                                                          ev_option=option)
            lookup = tfcluster.embedding_lookup
        numeric = tf.concat([features[name] for name in clicklog.NUMERIC], axis=1)
        h = tf.concat([numeric, tf.reshape(lookup(table, ids), [-1, COLUMNS * dimension])], 1)
        for i, units in enumerate(hidden):
            h = dense(h, units, f"dnn_{i}", tf.nn.relu, seed=2 + i)
        deep = dense(h, 1, "dnn_logit", seed=9)
        wide = tf.reduce_sum(lookup(wide_table, ids), axis=1)
        logits = tf.squeeze(deep + wide + tf1.get_variable("bias", [1], initializer=tf1.zeros_initializer()), 1)
        probability = tf.sigmoid(logits)
        if mode == Mode.PREDICT:
            return ModelOutput(predictions={"probability": probability})
        clicked = tf.cast(tf.squeeze(labels, 1), tf.float32)
        return ModelOutput(
            predictions=probability,
            per_example_loss=tf.nn.sigmoid_cross_entropy_with_logits(labels=clicked, logits=logits),
            metrics={"auc": tf1.metrics.auc(clicked, probability, num_thresholds=1000),
                     "accuracy": tf1.metrics.accuracy(clicked, tf.round(probability))})
    return model_fn


def parse(records):
    """(features, clicked) of a batch of serialized tf.Example records."""
    features = tf.io.parse_example(records, clicklog.feature_spec())
    return features, features.pop("clicked")


def train_input_fn(data_dir, examples, drift=0.0):
    """Each trainer reads (and makes, if missing) its own shard, shuffled and repeated; a drifting log's in
    time order, bar a shuffle over a few steps' examples."""
    def input_fn(ctx):
        path = clicklog.write_train(data_dir, ctx.input_pipeline_id, ctx.num_input_pipelines, examples, drift)
        records = tf.data.TFRecordDataset([path]).shuffle(2048 if drift else 20000, seed=ctx.input_pipeline_id)
        return records.repeat().batch(ctx.per_replica_batch, drop_remainder=True).map(parse).prefetch(2)
    return input_fn


def eval_input_fn(data_dir, drift=0.0, examples=0):
    """The held-out file, once: a drifting log's is the stream's next examples after its ``examples``."""
    def input_fn(ctx):
        path = clicklog.write_eval(data_dir, 20_000, drift, examples)
        return tf.data.TFRecordDataset([path]).batch(2000).map(parse)
    return input_fn


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=strategies.names(), default=None, metavar="MODE",
                   help="async or sync parameter servers (default: async on a cluster, local alone)")
    p.add_argument("--buckets", type=int, default=100_000, help="hash buckets per column (default 100000)")
    p.add_argument("--examples", type=int, default=100_000, help="training examples over all trainers")
    p.add_argument("--drift", type=float, default=0.0,
                   help="a click stream whose ids keep arriving (scripts/clicklog.py --drift; default 0: static)")
    p.add_argument("--steps", type=int, default=1000, help="global steps (default 1000)")
    p.add_argument("--batch", type=int, default=512, help="examples per worker and step (default 512)")
    p.add_argument("--lr", type=float, default=0.05, help="Adagrad learning rate (default 0.05)")
    p.add_argument("--embedding-variables", action="store_true",
                   help="a row per value, created as values arrive, instead of --buckets hashed rows per column")
    p.add_argument("--filter-freq", type=int, default=0,
                   help="with --embedding-variables: a value gets a row once seen this many times (default 0: at once)")
    p.add_argument("--steps-to-live", type=int, default=None,
                   help="with --embedding-variables: each save drops rows untouched for this many steps")
    p.add_argument("--checkpoint-dir", default=None, help="default: runs/click-through")
    p.add_argument("--data-dir", default=None, help="where the TFRecord files go (default: <checkpoint-dir>_data)")
    args = p.parse_args(argv)
    if args.buckets < 1:
        p.error(f"--buckets must be at least 1, got {args.buckets}")
    if args.drift < 0:
        p.error(f"--drift must be at least 0, got {args.drift}")
    option = None
    if args.embedding_variables:
        option = tfcluster.EmbeddingVariableOption(
            filter_option=tfcluster.CounterFilter(args.filter_freq) if args.filter_freq else None,
            evict_option=tfcluster.GlobalStepEvict(args.steps_to_live) if args.steps_to_live else None)
    tf1.disable_eager_execution()
    checkpoint_dir = args.checkpoint_dir or os.path.join("runs", "click-through")
    data_dir = args.data_dir or checkpoint_dir.rstrip("/") + "_data"
    held_out = eval_input_fn(data_dir, args.drift, args.examples)
    try:
        result = tfcluster.fit(
            make_model_fn(args.buckets, option=option), train_input_fn(data_dir, args.examples, args.drift),
            strategy=None if args.mode is None else strategies.get(args.mode), steps=args.steps,
            batch_size=args.batch, optimizer=lambda: tf1.train.AdagradOptimizer(args.lr),
            checkpoint_dir=checkpoint_dir, eval_input_fn=held_out, save_checkpoint_secs=30)
    except tfcluster.TfclusterError as e:  # a wrong cluster for the mode, a lost peer: one line, no traceback
        print(f"click_through_fit.py: error: {e}", file=sys.stderr)
        return e.exit_code
    if result is None:  # a ps task: it served until every worker was done
        return 0
    if result.task.startswith("evaluator"):
        last = result.evaluations[-1] if result.evaluations else {}
        print(f"{result.task}: auc {last.get('auc', float('nan')):.4f} at step {last.get('global_step')}")
        return 0
    print(f"{result.task}: {result.local_steps} steps, {result.examples_per_sec:.0f} examples/s")
    cluster = tfcluster.Cluster.from_tf_config() if os.environ.get("TF_CONFIG") else None
    if cluster is None or cluster.is_chief:
        # The checkpoint restores in this plain process, whole tables from their parts.
        model_fn = make_model_fn(args.buckets, option=option)
        metrics = tfcluster.evaluate(model_fn, held_out, checkpoint_dir)
        print(f"click-through at step {metrics['global_step']}: auc {metrics['auc']:.4f}, "
              f"accuracy {metrics['accuracy']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
