#!/usr/bin/env python3
"""Click logs to train embedding tables on, made here (no download): Criteo's shape, a rule that can be learned.

    python scripts/clicklog.py --out /tmp/clicks --examples 200000 --shards 2
    python scripts/clicklog.py --out /tmp/clicks --examples 1000000 --shards 4 --eval 50000
    python scripts/clicklog.py --out /tmp/stream --examples 400000 --drift 0.5     # ids that keep arriving

Each example has 13 numeric features ``I1``..``I13`` (log-scaled counts) and 26 categorical ones
``C1``..``C26``: strings whose values follow a Zipf law over each column's own vocabulary (a few values in
most rows, a long tail), as real click logs do; a model hashes them into ``--buckets`` rows per column. The
label is a click drawn from a fixed hidden rule (a weight per numeric feature and per frequent categorical
value; 23% of rows click), so accuracy and AUC mean something. Written as TFRecord shards of
``tf.Example`` protos, ``train-<i>-of-<n>.tfrecord`` (one per trainer) and ``eval.tfrecord``; writing is
atomic and skipped when the files are there, so tasks starting together agree.

With ``--drift D`` the log is a stream in time, as a recommender's is: new ids every step. A value's rank
stays Zipf, but the id at each rank moves on, by ``D`` ids an example in the biggest column (in proportion
to its vocabulary in the others): an id is born at the top and fades into the tail, and a device type stays
a device type. Clicks then follow a weight per id (every id, not only the frequent ones: a weight belongs to
what the id names, whatever its rank), so ids sharing a hashed row cost accuracy. Example ``j`` of shard
``i`` is the stream's example ``j * shards + i`` (the trainers walk through time together; read each shard
once, in order), and the evaluation file is the stream's next examples after the training ones: the
future, as a model trained on a stream is used. Files are named by their drift (``train-0-of-2-drift0.5``).
"""

import argparse
import os

import numpy as np

NUMERIC = ["I%d" % i for i in range(1, 14)]
CATEGORICAL = ["C%d" % i for i in range(1, 27)]
#: Each column's vocabulary: from tens of values (a device type) to millions (a user id), as in Criteo's.
VOCABULARY = [int(v) for v in np.geomspace(20, 5_000_000, len(CATEGORICAL))]
ZIPF = 1.2          # the exponent of each column's value frequencies
#: A drifting log's weight of each id in the logit: uniform, of this standard deviation (26 columns add up to
#: 1.3 logits, about the static rule's head weights).
ID_WEIGHT = 0.25


def _rule(seed=1234):
    """The hidden rule: a weight per numeric feature and per value of the 1,000 most frequent of each column."""
    rng = np.random.RandomState(seed)
    return rng.normal(0, 0.4, len(NUMERIC)), rng.normal(0, 0.6, (len(CATEGORICAL), 1000))


def _id_weights(column, ids):
    """A drifting log's hidden weight of each id of ``column``: a hash of both (splitmix64), so every id has
    one, the same in every file, without a table of them."""
    with np.errstate(over="ignore"):
        z = ids.astype(np.uint64) + np.uint64(column) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    uniform = (z >> np.uint64(11)).astype(np.float64) / 2.0 ** 53
    return ID_WEIGHT * np.sqrt(3.0) * (2 * uniform - 1)


def examples(n, seed, drift=0.0, start=0, stride=1):
    """``n`` examples: (numeric [n, 13] float32, categorical [n, 26] values, clicked [n] int64).

    Without ``drift`` the values are ranks; with it, ids at the stream's examples ``start``, ``start +
    stride``, ...: ``drift`` ids an example in the biggest column, born at rank 0.
    """
    rng = np.random.RandomState(seed)
    numeric = np.log1p(rng.exponential(scale=np.geomspace(1, 1000, len(NUMERIC)), size=(n, len(NUMERIC))))
    ranks = np.stack([(rng.zipf(ZIPF, n) - 1) % v for v in VOCABULARY], axis=1)
    w_numeric, w_value = _rule()
    centred = (numeric - numeric.mean(axis=0)) / (numeric.std(axis=0) + 1e-6)
    if drift:
        at = start + stride * np.arange(n, dtype=np.int64)
        speed = drift * np.asarray(VOCABULARY, np.float64) / max(VOCABULARY)
        values = np.floor(at[:, None] * speed[None, :]).astype(np.int64) - ranks
        weights = np.stack([_id_weights(c, values[:, c]) for c in range(len(CATEGORICAL))], axis=1)
        logit = centred @ w_numeric + weights.sum(axis=1) - 2.1
    else:
        values = ranks
        head = np.where(ranks < 1000, w_value[np.arange(len(CATEGORICAL)), np.minimum(ranks, 999)], 0.0)
        logit = centred @ w_numeric + head.sum(axis=1) - 3.1
    clicked = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return numeric.astype(np.float32), values, clicked


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


def write(path, n, seed, **stream):
    """``n`` examples as one TFRecord file at ``path``, atomically; nothing when it is there. ``stream``:
    ``examples``' drift, start and stride."""
    if os.path.exists(path):
        return path
    import tensorflow as tf
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with tf.io.TFRecordWriter(tmp) as writer:
        for record in _serialized(*examples(n, seed, **stream)):
            writer.write(record)
    os.replace(tmp, path)
    return path


def _drifting(drift):
    """The file names' mark of a drifting log: ``-drift0.5``, or nothing."""
    return "-drift%g" % drift if drift else ""


def train_path(out, index, shards, drift=0.0):
    """The training shard of trainer ``index`` of ``shards``."""
    return os.path.join(out, "train-%d-of-%d%s.tfrecord" % (index, shards, _drifting(drift)))


def write_train(out, index, shards, train_examples, drift=0.0):
    """Trainer ``index``'s shard (``train_examples`` over all ``shards``), made if missing; its path.

    Each trainer writes only what it reads, so a cluster makes its data in parallel.
    """
    os.makedirs(out, exist_ok=True)
    return write(train_path(out, index, shards, drift), -(-train_examples // shards), seed=index, drift=drift,
                 start=index, stride=shards)


def write_eval(out, eval_examples, drift=0.0, train_examples=0):
    """The evaluation file, made if missing (its seed is apart from every shard's); its path. A drifting log's
    is the stream's ``eval_examples`` after its ``train_examples``."""
    os.makedirs(out, exist_ok=True)
    name = "eval%s.tfrecord" % ("%s-after%d" % (_drifting(drift), train_examples) if drift else "")
    return write(os.path.join(out, name), eval_examples, seed=10_000, drift=drift, start=train_examples)


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
    p.add_argument("--drift", type=float, default=0.0,
                   help="new ids an example in the biggest column: a stream in time (default 0: a static log)")
    args = p.parse_args()
    if args.examples < args.shards or args.shards < 1 or args.eval < 1 or args.drift < 0:
        p.error("--examples must be at least --shards, --shards and --eval at least 1, and --drift at least 0")
    train = [write_train(args.out, i, args.shards, args.examples, args.drift) for i in range(args.shards)]
    print("wrote %s and %s" % (", ".join(train), write_eval(args.out, args.eval, args.drift, args.examples)))


if __name__ == "__main__":
    main()
