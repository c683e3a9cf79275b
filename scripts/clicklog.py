#!/usr/bin/env python3
"""Click logs to train embedding tables on, made here (no download): Criteo's shape, a rule that can be learned.

    python scripts/clicklog.py --out /tmp/clicks --examples 200000 --shards 2
    python scripts/clicklog.py --out /tmp/clicks --buckets 1000000 --eval 20000

Each example has 13 numeric features ``I1``..``I13`` (log-scaled counts) and 26 categorical ones
``C1``..``C26``: strings whose values follow a Zipf law over each column's own vocabulary (a few values in
most rows, a long tail), as real click logs do; a model hashes them into ``--buckets`` rows per column. The
label is a click drawn from a fixed hidden rule (a weight per numeric feature and per frequent categorical
value, about a quarter of rows click), so accuracy and AUC mean something. Written as TFRecord shards of
``tf.Example`` protos, ``train-<i>-of-<n>.tfrecord`` (one per trainer) and ``eval.tfrecord``; writing is
atomic and skipped when the files are there, so tasks starting together agree.
"""

import argparse
import os

import numpy as np

NUMERIC = ["I%d" % i for i in range(1, 14)]
CATEGORICAL = ["C%d" % i for i in range(1, 27)]
#: Each column's vocabulary: from tens of values (a device type) to millions (a user id), as in Criteo's.
VOCABULARY = [int(v) for v in np.geomspace(20, 5_000_000, len(CATEGORICAL))]
ZIPF = 1.2          # the exponent of each column's value frequencies


def _rule(seed=1234):
    """The hidden rule: a weight per numeric feature and per value of the 1,000 most frequent of each column."""
    rng = np.random.RandomState(seed)
    return rng.normal(0, 0.4, len(NUMERIC)), rng.normal(0, 0.6, (len(CATEGORICAL), 1000))


def examples(n, seed):
    """``n`` examples: (numeric [n, 13] float32, categorical [n, 26] value ranks, clicked [n] int64)."""
    rng = np.random.RandomState(seed)
    numeric = np.log1p(rng.exponential(scale=np.geomspace(1, 1000, len(NUMERIC)), size=(n, len(NUMERIC))))
    ranks = np.stack([(rng.zipf(ZIPF, n) - 1) % v for v in VOCABULARY], axis=1)
    w_numeric, w_value = _rule()
    centred = (numeric - numeric.mean(axis=0)) / (numeric.std(axis=0) + 1e-6)
    head = np.where(ranks < 1000, w_value[np.arange(len(CATEGORICAL)), np.minimum(ranks, 999)], 0.0)
    logit = centred @ w_numeric + head.sum(axis=1) - 1.3
    clicked = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return numeric.astype(np.float32), ranks, clicked


def _serialized(numeric, ranks, clicked):
    import tensorflow as tf
    for row_numeric, row_ranks, label in zip(numeric, ranks, clicked):
        feature = {name: tf.train.Feature(float_list=tf.train.FloatList(value=[v]))
                   for name, v in zip(NUMERIC, row_numeric)}
        feature.update({name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"%s:%d" % (name.encode(), r)]))
                        for name, r in zip(CATEGORICAL, row_ranks)})
        feature["clicked"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
        yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write(path, n, seed):
    """``n`` examples as one TFRecord file at ``path``, atomically; nothing when it is there."""
    if os.path.exists(path):
        return path
    import tensorflow as tf
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with tf.io.TFRecordWriter(tmp) as writer:
        for record in _serialized(*examples(n, seed)):
            writer.write(record)
    os.replace(tmp, path)
    return path


def write_all(out, train_examples, shards, eval_examples):
    """The training shards (``train_examples`` in all, one file per trainer) and the eval file; their paths."""
    os.makedirs(out, exist_ok=True)
    per_shard = -(-train_examples // shards)
    train = [write(os.path.join(out, "train-%d-of-%d.tfrecord" % (i, shards)), per_shard, seed=i)
             for i in range(shards)]
    return train, write(os.path.join(out, "eval.tfrecord"), eval_examples, seed=10_000)


def feature_spec():
    """The ``parse_example`` spec of these records (the label ``clicked`` included)."""
    import tensorflow as tf
    spec = {name: tf.io.FixedLenFeature([1], tf.float32) for name in NUMERIC}
    spec.update({name: tf.io.FixedLenFeature([1], tf.string) for name in CATEGORICAL})
    spec["clicked"] = tf.io.FixedLenFeature([1], tf.int64)
    return spec


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for the TFRecord files")
    p.add_argument("--examples", type=int, default=200_000, help="training examples in all (default 200000)")
    p.add_argument("--shards", type=int, default=2, help="training files, one per trainer (default 2)")
    p.add_argument("--eval", type=int, default=20_000, help="evaluation examples (default 20000)")
    args = p.parse_args()
    if args.examples < args.shards or args.shards < 1 or args.eval < 1:
        p.error("--examples must be at least --shards, and --shards and --eval at least 1")
    train, evaluation = write_all(args.out, args.examples, args.shards, args.eval)
    print("wrote %s and %s" % (", ".join(train), evaluation))


if __name__ == "__main__":
    main()
