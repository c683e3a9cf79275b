"""A TF 1.x Estimator program, as such programs were written: a custom model_fn, numpy input, train_and_evaluate.

    python estimator_custom.py --model_dir DIR [--max_steps N] [--sync] [--towers N]

(under ``tfcluster local --tf1``: ``import tensorflow as tf`` is TF 1.x's API).

Each task plays its role from TF_CONFIG. A trainer prints ``STEPS <task> <local steps>`` when it is done;
the evaluator prints ``EVAL <metrics as JSON>``; with --sync, the model trains with SyncReplicasOptimizer
over every trainer, on a deterministic shard per trainer (for the test that compares it with one process);
with --towers N, the RunConfig names ``tf.contrib.distribute.ParameterServerStrategy(num_gpus_per_worker=N)``.
"""

import argparse
import json

import numpy as np
import tensorflow as tf

rng = np.random.RandomState(0)
X = rng.rand(512, 4).astype(np.float32)
W_TRUE = np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)
Y_CLASS = np.digitize(X.dot(W_TRUE)[:, 0], [0.6, 1.8]).astype(np.int64)
Y_REAL = X.dot(W_TRUE) + 0.1


class StepCounter(tf.train.SessionRunHook):
    """A user's own hook: counts the steps this task ran."""

    def __init__(self):
        self.steps = 0

    def after_run(self, run_context, run_values):
        self.steps += 1


def classifier_fn(features, labels, mode, params, config):
    hidden = tf.layers.dense(features["x"], 16, activation=tf.nn.relu, name="hidden")
    logits = tf.layers.dense(hidden, 3, name="logits")
    classes = tf.argmax(logits, 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"class": classes, "logits": logits},
                                          export_outputs={"serving_default":
                                                          tf.estimator.export.PredictOutput({"logits": logits})})
    loss = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    metrics = {"accuracy": tf.metrics.accuracy(labels, classes)}
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    train_op = tf.train.AdagradOptimizer(params["lr"]).minimize(loss, global_step=tf.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                      training_hooks=[tf.train.LoggingTensorHook({"loss": loss}, every_n_iter=100)])


def linear_fn(features, labels, mode, params, config):
    """A linear regression, trained with SyncReplicasOptimizer over every trainer."""
    w = tf.get_variable("w", [4, 1], initializer=tf.zeros_initializer())
    prediction = tf.matmul(features["x"], w)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"y": prediction})
    loss = tf.reduce_mean(tf.square(prediction - labels))
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    n = config.num_worker_replicas
    opt = tf.train.SyncReplicasOptimizer(tf.train.GradientDescentOptimizer(params["lr"]), replicas_to_aggregate=n,
                                         total_num_replicas=n)
    train_op = opt.minimize(loss, global_step=tf.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                      training_hooks=[opt.make_session_run_hook(config.is_chief)])


def sync_input_fn(params, config):
    """Trainer k reads examples k, k+n, k+2n... in order, 16 per batch, round and round."""
    shard = config.global_id_in_cluster if config.task_type != "evaluator" else 0
    n = config.num_worker_replicas if config.task_type != "evaluator" else 1
    ds = tf.data.Dataset.from_tensor_slices(({"x": X[shard::n]}, Y_REAL[shard::n])).repeat()
    return ds.batch(16)


def make_estimator(model_dir, sync=False, lr=0.2, towers=None):
    """The program's Estimator (its config from TF_CONFIG)."""
    strategy = tf.contrib.distribute.ParameterServerStrategy(num_gpus_per_worker=towers) if towers else None
    config = tf.estimator.RunConfig(save_checkpoints_steps=100, log_step_count_steps=100, train_distribute=strategy)
    return tf.estimator.Estimator(linear_fn if sync else classifier_fn, model_dir=model_dir, config=config,
                                  params={"lr": lr})


def serving_input_receiver_fn():
    return tf.estimator.export.build_raw_serving_input_receiver_fn(
        {"x": tf.placeholder(tf.float32, [None, 4])})()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--max_steps", type=int, default=400)
    p.add_argument("--sync", action="store_true")
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--towers", type=int, default=None)
    args = p.parse_args()
    estimator = make_estimator(args.model_dir, args.sync, args.lr, args.towers)
    config = estimator.config
    counter = StepCounter()
    if args.sync:
        train_input, eval_input, eval_steps, exporters = sync_input_fn, sync_input_fn, 4, []
    else:
        train_input = tf.estimator.inputs.numpy_input_fn({"x": X}, Y_CLASS, batch_size=32, num_epochs=None,
                                                         shuffle=True)
        eval_input = tf.estimator.inputs.numpy_input_fn({"x": X}, Y_CLASS, batch_size=128, shuffle=False)
        eval_steps = None
        exporters = [tf.estimator.LatestExporter("latest", serving_input_receiver_fn, exports_to_keep=2)]
    train_spec = tf.estimator.TrainSpec(train_input, max_steps=args.max_steps, hooks=[counter])
    eval_spec = tf.estimator.EvalSpec(eval_input, steps=eval_steps, exporters=exporters, start_delay_secs=0,
                                      throttle_secs=1)
    result, exports = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    if config.task_type in ("chief", "master", "worker"):
        print(f"STEPS {config.task_type}:{config.task_id} {counter.steps}", flush=True)
    if result is not None:
        print("EVAL " + json.dumps({k: float(v) for k, v in result.items()}), flush=True)
        print("EXPORTS " + json.dumps([e.decode() if isinstance(e, bytes) else e for e in exports]), flush=True)


if __name__ == "__main__":
    main()
