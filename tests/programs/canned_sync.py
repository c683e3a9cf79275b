"""A TF 1.x canned LinearRegressor trained in sync across the trainers: SyncReplicasOptimizer as its optimizer.

    python canned_sync.py --model_dir DIR [--max_steps N]

Each trainer reads its own deterministic shard (every n-th row, from its global id), 16 rows a step; the loss is
averaged over the batch (``SUM_OVER_BATCH_SIZE``), so one sync step is one process's step on the 2 x 16 rows.
Trainers print ``STEPS <task> <local steps>``.
"""

import argparse

import numpy as np
import tensorflow as tf

rng = np.random.RandomState(0)
A, B = rng.rand(512).astype(np.float32), rng.rand(512).astype(np.float32)
Y = (1.0 * A - 2.0 * B + 0.5).astype(np.float32)


class StepCounter(tf.train.SessionRunHook):
    def __init__(self):
        self.steps = 0

    def after_run(self, run_context, run_values):
        self.steps += 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--max_steps", type=int, default=30)
    args = p.parse_args()
    config = tf.estimator.RunConfig(save_checkpoints_steps=10)
    n, shard = config.num_worker_replicas, config.global_id_in_cluster
    optimizer = tf.train.SyncReplicasOptimizer(tf.train.GradientDescentOptimizer(0.1), replicas_to_aggregate=n,
                                               total_num_replicas=n)
    estimator = tf.estimator.LinearRegressor(
        [tf.feature_column.numeric_column("a"), tf.feature_column.numeric_column("b")], model_dir=args.model_dir,
        optimizer=optimizer, loss_reduction=tf.losses.Reduction.SUM_OVER_BATCH_SIZE, config=config)

    def shard_input():
        rows = tf.data.Dataset.from_tensor_slices(({"a": A[shard::n], "b": B[shard::n]}, Y[shard::n]))
        return rows.repeat().batch(16)
    counter = StepCounter()
    tf.estimator.train_and_evaluate(estimator, tf.estimator.TrainSpec(shard_input, max_steps=args.max_steps,
                                                                      hooks=[counter]),
                                    tf.estimator.EvalSpec(shard_input, steps=2))
    print("STEPS %s:%d %d" % (config.task_type, config.task_id, counter.steps), flush=True)


if __name__ == "__main__":
    main()
