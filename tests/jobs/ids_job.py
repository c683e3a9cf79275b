"""A training job that counts which examples it trained on: ``python ids_job.py --steps N --ckpt DIR ...``.

Its examples are the ids ``0 .. --ids - 1``; the model keeps ``seen``, how
often each id reached a training step, beside its one weight, so a
checkpoint says what the run has read (the input-position tests compare a
preempted run's counts with an uninterrupted one's). The tests import
:func:`make_model_fn` and :func:`make_input_fn` for the one-process side.
"""

import argparse
import os
import sys
import time


def make_model_fn(ids: int):
    """``model_fn`` of ``fit``: y = w x, and ``seen[id] += 1`` for each id in the batch, with the step."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    from tfcluster.strategies import ModelOutput

    def model_fn(features, labels, mode):
        w = tf1.get_variable("w", shape=[], initializer=tf1.zeros_initializer())
        seen = tf1.get_variable("seen", shape=[ids], dtype=tf.int32, initializer=tf1.zeros_initializer(),
                                trainable=False)
        tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS,
                              tf1.scatter_add(seen, features["id"], tf.ones_like(features["id"], tf.int32)))
        pred = w * features["x"]
        return ModelOutput(predictions=pred, per_example_loss=tf.square(pred - labels))
    return model_fn


def make_input_fn(ids: int, shuffle_seed=None, step_sleep: float = 0.0):
    """``input_fn(ctx)``: this worker's shard of the ids, shuffled with ``shuffle_seed`` if given."""
    import tensorflow as tf

    def input_fn(ctx):
        ds = ctx.shard(tf.data.Dataset.range(ids))
        if shuffle_seed is not None:
            ds = ds.shuffle(64, seed=shuffle_seed)
        ds = ds.map(lambda i: ({"id": tf.cast(i, tf.int32), "x": tf.cast(i % 7, tf.float32)},
                               tf.cast(i % 7, tf.float32) * 0.5))
        if step_sleep:
            # A slow reader (a stateful py_function in a map is saved with the position and run again after it).
            ds = ds.map(lambda f, y: (f, y + 0.0 * tf.py_function(lambda: time.sleep(step_sleep) or 0.0, [],
                                                                    tf.float32)))
        return ds.batch(ctx.per_replica_batch, drop_remainder=True)
    return input_fn


def seen(checkpoint_dir: str):
    """The ``seen`` counts in the latest checkpoint of ``checkpoint_dir``."""
    import tensorflow as tf
    return tf.train.load_variable(tf.train.latest_checkpoint(checkpoint_dir), "seen")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True, help="global step target")
    p.add_argument("--ckpt", required=True, help="checkpoint dir (shared by every task)")
    p.add_argument("--ids", type=int, default=4000)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--shuffle-seed", type=int, default=None)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds each batch takes to read")
    p.add_argument("--save-steps", type=int, default=100000)
    args = p.parse_args()

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tensorflow as tf

    import tfcluster
    from tfcluster.core.logs import setup_cli_logging
    tf.compat.v1.disable_eager_execution()
    setup_cli_logging()
    tfcluster.fit(make_model_fn(args.ids), make_input_fn(args.ids, args.shuffle_seed, args.step_sleep / args.batch),
                  optimizer=lambda: tf.compat.v1.train.GradientDescentOptimizer(0.01), steps=args.steps,
                  batch_size=args.batch, checkpoint_dir=args.ckpt, save_checkpoint_steps=args.save_steps,
                  save_checkpoint_secs=None, log_every_secs=0.5)


if __name__ == "__main__":
    main()
