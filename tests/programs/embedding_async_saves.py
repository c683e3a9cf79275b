"""Hot rows of an embedding variable trained by 2 async workers while the chief saves every 20 steps.

    tfcluster local --ps 2 --workers 2 -- python embedding_async_saves.py CHECKPOINT_DIR

Every step each worker looks up 32 distinct ids of 200 and differentiates the sum of their rows, scaled so each
looked-up row gets a gradient of exactly 1 in every coordinate; Adagrad (lr 0.1, accumulator 0.1) then gives a
row updated k times the accumulator 0.1 + k and the weights ``w0 - 0.1 * sum(1 / sqrt(0.1 + j), j = 1..k)``. A
save that took a row's weights and its accumulator from different moments breaks that equation
(tests/test_embedding_variables.py checks every row of every checkpoint).

worker:1 starts training once the chief has saved its first checkpoint: a chief slow to start (its first save
compiles the save ops; CI's loaded machine took seconds) let worker:1 run almost all 600 steps alone, and the
run ended with 2 saves instead of about 30.
"""

import glob
import json
import os
import sys
import time

import tfcluster

tfcluster.quiet_tensorflow()
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
BATCH, IDS, LR = 32, 200, 0.1


TF_CONFIG = json.loads(os.environ.get("TF_CONFIG", "{}"))


def workers() -> int:
    return len(TF_CONFIG.get("cluster", {}).get("worker", [None]))


def task_index() -> int:
    return TF_CONFIG.get("task", {}).get("index", 0)


def wait_for_first_save(checkpoint_dir: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while not glob.glob(os.path.join(checkpoint_dir, "model.ckpt-*.index")):
        if time.monotonic() > deadline:
            sys.exit(f"worker:{task_index()}: no checkpoint in {checkpoint_dir} after {timeout:g}s of waiting "
                     "for the chief's first save")
        time.sleep(0.05)


def model_fn(features, labels, mode):
    ev = tfcluster.get_embedding_variable("hot", 4)
    rows = tfcluster.embedding_lookup(ev, features)
    # fit divides the summed per-example loss by the global batch (BATCH x workers in async training).
    per_example = tf.reduce_sum(rows, 1) * float(BATCH * workers())
    return tfcluster.ModelOutput(predictions=rows, per_example_loss=per_example)


def input_fn(ctx):
    ids = tf.data.Dataset.range(1).repeat().map(lambda _: tf.random.shuffle(tf.range(IDS, dtype=tf.int64))[:BATCH])
    return ids.map(lambda x: (x, tf.zeros([BATCH])))


def main():
    tf1.disable_eager_execution()
    if task_index() > 0:
        wait_for_first_save(sys.argv[1])
    result = tfcluster.fit(model_fn, input_fn, steps=600, batch_size=None,
                           optimizer=lambda: tf1.train.AdagradOptimizer(LR, initial_accumulator_value=0.1),
                           checkpoint_dir=sys.argv[1], save_checkpoint_steps=20, save_checkpoint_secs=None,
                           keep_checkpoints=100)
    if result is not None:
        print(f"{result.task}: {result.local_steps} steps, loss {result.loss:.3f}", flush=True)


if __name__ == "__main__":
    main()
