"""The Keras job the fault tests kill and stop: ``python keras_job.py --epochs N [--ckpt DIR] ...``.

New code, as docs/estimator.md shows it: a compiled tf-keras model trained with ``tfcluster.keras.fit`` in
whatever role TF_CONFIG gives it. A callback logs every batch with the update count the optimizer reads on
the ps (``worker:0 batch 12 (updates 30)``), so a test can read where the run stood at a fault; the
session's options (checkpoint period, step and chief timeouts) are ``fit``'s keywords. ``--until FILE`` ends
training once the test made FILE, so a fault test's run lasts as long as its faults take, however loaded the
machine (CI saw a fixed epoch count run out before a slow restart was done).
"""

import argparse
import json
import os
import sys
import time

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, required=True)
p.add_argument("--chief-epochs", type=int, default=None, help="worker:0's epochs (default: --epochs)")
p.add_argument("--until", default=None, help="stop training after the batch in which this file exists")
p.add_argument("--ckpt", default=None, help="checkpoint dir (default: the run's)")
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--save-secs", type=float, default=60.0)
p.add_argument("--step-timeout", type=float, default=60.0)
p.add_argument("--chief-timeout", type=float, default=60.0)
p.add_argument("--new-optimizer", action="store_true", help="tf_keras.optimizers.SGD (eager-only) instead of legacy")
args = p.parse_args()

import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()
import tf_keras  # noqa: E402

import tfcluster  # noqa: E402
import tfcluster.keras  # noqa: E402
from tfcluster.core.logs import setup_cli_logging  # noqa: E402

setup_cli_logging()
task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
name = f"{task.get('type', 'local')}:{task.get('index', 0)}"
print(f"pid {os.getpid()} restart {os.environ.get('TFCLUSTER_RESTART_COUNT', '-')}", flush=True)

rng = np.random.RandomState(0)
x = rng.rand(512, 8).astype(np.float32)
y = (x.sum(axis=1) > 4).astype(np.int64)
model = tf_keras.Sequential([tf_keras.layers.Dense(32, activation="relu", input_shape=(8,)),
                             tf_keras.layers.Dense(2, activation="softmax")])
optimizers = tf_keras.optimizers if args.new_optimizer else tf_keras.optimizers.legacy
model.compile(optimizer=optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")


class Log(tf_keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        updates = int(tf_keras.backend.get_value(self.model.optimizer.iterations))
        print(f"{name} batch {self.batches} (updates {updates})", flush=True)
        time.sleep(args.step_sleep)
        if args.until and os.path.exists(args.until):
            self.model.stop_training = True


try:
    epochs = args.chief_epochs if args.chief_epochs is not None and name == "worker:0" else args.epochs
    tfcluster.keras.fit(model, x, y, epochs=epochs, batch_size=32, verbose=0, callbacks=[Log()],
                        checkpoint_dir=args.ckpt, save_checkpoint_secs=args.save_secs,
                        step_timeout_secs=args.step_timeout, chief_timeout_secs=args.chief_timeout)
except tfcluster.TfclusterError as e:   # as examples/digits.py: one line and the error's exit code
    print(f"keras_job: error: {e}", file=sys.stderr, flush=True)
    sys.exit(e.exit_code)
print(f"{name} ends with updates {int(tf_keras.backend.get_value(model.optimizer.iterations))}", flush=True)
