"""A training script the cluster tests run as real processes: ``python _fit_job.py CONFIG.json``.

It trains a small fixed MLP (10-16-3, weights from the data file) with plain
SGD through ``tfcluster.train.fit`` on the role TF_CONFIG gives it, and writes
fit's result as JSON to ``<out>/<task>.json``. The tests also import
``model_fn``/``input_fn`` from here for the single-process side.
"""

import json
import logging
import os
import sys
import time

import numpy as np

# Legacy scripts often run with TF1 behaviour; the tests exercise both worlds.
V1 = os.environ.get("FIT_JOB_V1") == "1"


def load(path):
    d = np.load(path)
    return {k: d[k] for k in d.files}


def make_model_fn(data):
    import tensorflow as tf
    tf1 = tf.compat.v1
    from tfcluster.strategies import Mode, ModelOutput

    def model_fn(features, labels, mode):
        w1 = tf1.get_variable("dense/w1", initializer=data["w1"])
        b1 = tf1.get_variable("dense/b1", initializer=data["b1"])
        w2 = tf1.get_variable("out/w2", initializer=data["w2"])
        b2 = tf1.get_variable("out/b2", initializer=data["b2"])
        logits = tf.matmul(tf.nn.tanh(tf.matmul(features, w1) + b1), w2) + b2
        pred = tf.argmax(logits, 1)
        if mode == Mode.PREDICT:
            return ModelOutput(predictions={"logits": logits, "class": pred})
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        return ModelOutput(predictions=pred, per_example_loss=loss,
                           metrics={"accuracy": tf1.metrics.accuracy(labels, pred)})
    return model_fn


def make_input_fn(data, step_sleep=0.0):
    import tensorflow as tf

    def input_fn(ctx):
        ds = ctx.shard(tf.data.Dataset.from_tensor_slices((data["x"], data["y"])))
        ds = ds.batch(ctx.per_replica_batch, drop_remainder=True)
        if step_sleep:
            def slow(x, y):
                t = tf.py_function(lambda: time.sleep(step_sleep) or 0.0, [], tf.float32)
                return x + 0.0 * t, y
            ds = ds.map(slow)
        return ds
    return input_fn


def make_eval_input_fn(data):
    import tensorflow as tf
    return lambda ctx: tf.data.Dataset.from_tensor_slices((data["x"], data["y"])).batch(256)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cfg = json.load(f)
    import tensorflow as tf
    if V1:
        tf.compat.v1.disable_v2_behavior()
    from tfcluster.cli import setup_logging
    from tfcluster.strategies import ParameterServerStrategy
    from tfcluster.train import fit
    setup_logging()
    logging.getLogger("tfcluster").setLevel(logging.DEBUG if cfg.get("debug") else logging.INFO)
    data = load(cfg["data"])
    strategy = None
    if cfg.get("mode"):
        strategy = ParameterServerStrategy(cfg["mode"], stall_warn_secs=cfg.get("stall_warn_secs", 30.0),
                                           stall_timeout_secs=cfg.get("stall_timeout_secs", 600.0))
    result = fit(make_model_fn(data), make_input_fn(data, cfg.get("step_sleep", 0.0)),
                 optimizer=lambda: tf.compat.v1.train.GradientDescentOptimizer(cfg.get("lr", 0.5)),
                 steps=cfg["steps"], strategy=strategy, batch_size=cfg["batch"],
                 checkpoint_dir=cfg["checkpoint_dir"], save_checkpoint_steps=cfg.get("save_steps"),
                 save_checkpoint_secs=None, log_every_secs=cfg.get("log_every_secs", 1.0),
                 eval_input_fn=make_eval_input_fn(data), evaluator_timeout_secs=cfg.get("evaluator_timeout", 120),
                 startup_timeout=cfg.get("startup_timeout", 120))
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"type": "local", "index": 0})
    if result is not None and cfg.get("out"):
        os.makedirs(cfg["out"], exist_ok=True)
        with open(os.path.join(cfg["out"], f"{task['type']}{task['index']}.json"), "w", encoding="utf-8") as f:
            json.dump(result.__dict__, f, default=str)


if __name__ == "__main__":
    main()
