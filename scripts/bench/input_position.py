"""What saving a trainer's input position costs: ``python scripts/bench/input_position.py``.

``fit`` and the Estimator save each trainer's ``tf.data`` iterator beside the
checkpoints (tfcluster/training/input_position.py), on the checkpoint cadence
(60 s by default). A save holds what the pipeline's buffers hold, so its cost
is the pipeline's: this probe times saves and a restore, in one process, of
the bench's in-memory data (100,000 rows of 64 floats, batch 64, prefetch)
without a shuffle buffer and with one of 10,000 rows. It prints the median
and the min-max spread of 9 saves, the file size and one restore's time.
"""

import os
import statistics
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf
from tensorflow.python.util import deprecation

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from tfcluster.data.pipeline import arrays_outside_the_graph, without_autotune_thread  # noqa: E402

tf1 = tf.compat.v1


def measure(shuffle: int, out: str, saves: int = 9) -> str:
    rng = np.random.RandomState(0)
    x, y = rng.rand(100000, 64).astype(np.float32), rng.randint(0, 10, 100000).astype(np.int64)
    with tf1.Graph().as_default():
        with arrays_outside_the_graph():
            ds = tf.data.Dataset.from_tensor_slices((x, y))
        if shuffle:
            ds = ds.shuffle(shuffle, seed=1)
        ds = without_autotune_thread(ds.batch(64).repeat().prefetch(tf.data.experimental.AUTOTUNE))
        iterator = tf1.data.make_initializable_iterator(ds)
        batch = iterator.get_next()
        with deprecation.silence():
            saveable = tf1.data.experimental.make_saveable_from_iterator(iterator, external_state_policy="ignore")
        saver = tf1.train.Saver([saveable], max_to_keep=2)
        prefix = os.path.join(out, f"position-shuffle{shuffle}")
        with tf1.Session() as session:
            session.run(iterator.initializer)
            for _ in range(50):
                session.run(batch)
            times = []
            for step in range(saves):
                t = time.perf_counter()
                path = saver.save(session, prefix, global_step=step, write_meta_graph=False)
                times.append(time.perf_counter() - t)
                session.run(batch)
            size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)
                       if f.startswith(os.path.basename(path) + "."))
            t = time.perf_counter()
            saver.restore(session, path)
            restore = time.perf_counter() - t
    ms = [1000 * s for s in times]
    return (f"| {shuffle or 'none'} | {statistics.median(ms):.1f} ms ({min(ms):.1f}-{max(ms):.1f}) | "
            f"{size / 1e6:.2f} MB | {1000 * restore:.1f} ms |")


def main():
    tf1.disable_eager_execution()
    print("| shuffle buffer | save: median (min-max) | size | restore |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as out:
        for shuffle in (0, 10000):
            print(measure(shuffle, out), flush=True)


if __name__ == "__main__":
    main()
