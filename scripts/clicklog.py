#!/usr/bin/env python3
"""Click logs to train embedding tables on, made here (no download): Criteo's shape, a rule that can be learned.

    python scripts/clicklog.py --out /tmp/clicks --examples 200000 --shards 2
    python scripts/clicklog.py --out /tmp/clicks --examples 1000000 --shards 4 --eval 50000

Each example has 13 numeric features ``I1``..``I13`` (log-scaled counts) and 26 categorical ones
``C1``..``C26``: strings whose values follow a Zipf law over each column's own vocabulary (a few values in
most rows, a long tail), as real click logs do; a model hashes them into ``--buckets`` rows per column. The
label is a click drawn from a fixed hidden rule (a weight per numeric feature and per frequent categorical
value; 23% of rows click), so accuracy and AUC mean something. Written as TFRecord shards of
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
    logit = centred @ w_numeric + head.sum(axis=1) - 3.1
    clicked = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return numeric.astype(np.float32), ranks, clicked


def _serialized(numeric, ranks, clicked):
    """Each row as a serialized ``tf.Example``: one message refilled in place (10x faster than one per row)."""
    import tensorflow as tf
    example = tf.train.Example()
    feature = example.features.feature
    floats = [feature[name].float_list.value for name in NUMERIC]
    strings = [feature[name].bytes_list.value for name in CATEGORICAL]
    label = feature["clicked"].int64_list.value
    for values in floats + [label]:
        values.append(0)
    for values in strings:
        values.append(b"")
    prefixes = [name.encode() + b":" for name in CATEGORICAL]
    for row_numeric, row_ranks, clicked_ in zip(numeric.tolist(), ranks.tolist(), clicked.tolist()):
        for values, v in zip(floats, row_numeric):
            values[0] = v
        for values, prefix, r in zip(strings, prefixes, row_ranks):
            values[0] = prefix + str(r).encode()
        label[0] = clicked_
        yield example.SerializeToString(deterministic=True)


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


def train_path(out, index, shards):
    """The training shard of trainer ``index`` of ``shards``."""
    return os.path.join(out, "train-%d-of-%d.tfrecord" % (index, shards))


def write_train(out, index, shards, train_examples):
    """Trainer ``index``'s shard (``train_examples`` over all ``shards``), made if missing; its path.

    Each trainer writes only what it reads, so a cluster makes its data in parallel.
    """
    os.makedirs(out, exist_ok=True)
    return write(train_path(out, index, shards), -(-train_examples // shards), seed=index)


def write_eval(out, eval_examples):
    """The evaluation file, made if missing (its seed is apart from every shard's); its path."""
    os.makedirs(out, exist_ok=True)
    return write(os.path.join(out, "eval.tfrecord"), eval_examples, seed=10_000)


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
    train = [write_train(args.out, i, args.shards, args.examples) for i in range(args.shards)]
    print("wrote %s and %s" % (", ".join(train), write_eval(args.out, args.eval)))


if __name__ == "__main__":
    main()
