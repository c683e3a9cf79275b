"""A training script the cluster tests run as real processes: ``python _fit_job.py CONFIG.json``.

It trains a small fixed MLP (10-16-3, weights from the data file) with plain
SGD through ``tfcluster.training.train.fit`` on the role TF_CONFIG gives it, and writes
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

    def fixed(name, key):
        full = data[key]

        def init(shape, dtype=None, partition_info=None):
            # A partitioned variable asks for its part only.
            off = partition_info.var_offset if partition_info is not None else [0] * len(shape)
            return tf.constant(full[tuple(slice(o, o + n) for o, n in zip(off, shape))], dtype=tf.float32)
        return tf1.get_variable(name, shape=full.shape, dtype=tf.float32, initializer=init)

    def model_fn(features, labels, mode):
        w1, b1 = fixed("dense/w1", "w1"), fixed("dense/b1", "b1")
        w2, b2 = fixed("out/w2", "w2"), fixed("out/b2", "b2")
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


NAMES = ("dense/w1", "dense/b1", "out/w2", "out/b2")


def make_data(path, rows=512, seed=0):
    """Fixed data and initial weights for the tests, saved as an .npz file."""
    rng = np.random.RandomState(seed)
    x = rng.randn(rows, 10).astype("float32")
    y = (x @ rng.randn(10, 3)).argmax(1).astype("int64")
    np.savez(path, x=x, y=y, w1=(rng.randn(10, 16) * 0.3).astype("float32"), b1=np.zeros(16, "float32"),
             w2=(rng.randn(16, 3) * 0.3).astype("float32"), b2=np.zeros(3, "float32"))
    return load(path)


def forward(weights, x):
    """The model's logits in numpy, from a dict of the four weights."""
    h = np.tanh(x @ weights["dense/w1"] + weights["dense/b1"])
    return h @ weights["out/w2"] + weights["out/b2"]


def mean_loss(weights, x, y):
    """Mean softmax cross-entropy in numpy."""
    z = forward(weights, x)
    z = z - z.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]))


def reference_weights(data, steps, batch, lr=0.5):
    """Hand-written TF1 training with feed_dict: one process, batch ``batch``, plain SGD on the mean loss.

    Batch t holds rows [t*batch, (t+1)*batch) of each pass over the data, as
    the workers' interleaved shards add up to.
    """
    import tensorflow as tf
    tf1 = tf.compat.v1
    g = tf1.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 10])
        y = tf1.placeholder(tf.int64, [None])
        w = [tf1.Variable(data[k]) for k in ("w1", "b1", "w2", "b2")]
        logits = tf.matmul(tf.nn.tanh(tf.matmul(x, w[0]) + w[1]), w[2]) + w[3]
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        train = tf1.train.GradientDescentOptimizer(lr).minimize(loss)
        per_pass = len(data["x"]) // batch
        with tf1.Session() as s:
            s.run(tf1.global_variables_initializer())
            for t in range(steps):
                i = (t % per_pass) * batch
                s.run(train, {x: data["x"][i:i + batch], y: data["y"][i:i + batch]})
            return dict(zip(NAMES, s.run(w)))


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cfg = json.load(f)
    import tensorflow as tf
    if V1:
        tf.compat.v1.disable_v2_behavior()
    from tfcluster.core.logs import setup_cli_logging
    from tfcluster.strategies import ParameterServerStrategy
    from tfcluster.training.train import fit
    setup_cli_logging()
    logging.getLogger("tfcluster").setLevel(logging.DEBUG if cfg.get("debug") else logging.INFO)
    data = load(cfg["data"])
    strategy = None
    if cfg.get("mode"):
        strategy = ParameterServerStrategy(cfg["mode"], replicas_to_aggregate=cfg.get("replicas_to_aggregate"),
                                           partition_min_bytes=cfg.get("partition_min_bytes"),
                                           stall_warn_secs=cfg.get("stall_warn_secs", 30.0),
                                           stall_timeout_secs=cfg.get("stall_timeout_secs", 600.0))
    result = fit(make_model_fn(data), make_input_fn(data, cfg.get("step_sleep", 0.0)),
                 optimizer=lambda: tf.compat.v1.train.GradientDescentOptimizer(cfg.get("lr", 0.5)),
                 steps=cfg["steps"], strategy=strategy, batch_size=cfg["batch"],
                 checkpoint_dir=cfg["checkpoint_dir"], save_checkpoint_steps=cfg.get("save_steps"),
                 save_checkpoint_secs=None, log_every_secs=cfg.get("log_every_secs", 1.0),
                 eval_input_fn=make_eval_input_fn(data), evaluator_timeout_secs=cfg.get("evaluator_timeout", 120),
                 startup_timeout=cfg.get("startup_timeout", 120), log_placement=cfg.get("log_placement", False))
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"type": "local", "index": 0})
    if result is not None and cfg.get("out"):
        os.makedirs(cfg["out"], exist_ok=True)
        with open(os.path.join(cfg["out"], f"{task['type']}{task['index']}.json"), "w", encoding="utf-8") as f:
            json.dump(result.__dict__, f, default=str)


if __name__ == "__main__":
    main()
