"""Horovod's examples/tensorflow_mnist_estimator.py as Horovod 0.16-0.19 wrote it, on generated data.

``hvd.init()``, a GPU pinned by local rank in the ``RunConfig``'s session
config, ``model_dir`` on rank 0 alone (the others train in a temporary one),
``hvd.DistributedOptimizer`` in the ``model_fn``, ``BroadcastGlobalVariablesHook(0)``
given to ``train``, ``numpy_input_fn``, ``steps`` divided by the size, then
``evaluate``. The model is smaller (no download, two cores): a dense layer on
64 features. Prints each rank's accuracy, global step and a checksum of its
trained weights (the copies must agree).
"""

import argparse
import tempfile

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

tf.logging.set_verbosity(tf.logging.WARN)


def model_fn(features, labels, mode):
    hidden = tf.layers.dense(features["x"], 32, activation=tf.nn.relu)
    logits = tf.layers.dense(hidden, 2)
    predictions = {"classes": tf.argmax(input=logits, axis=1)}
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode=mode, predictions=predictions)
    loss = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    if mode == tf.estimator.ModeKeys.TRAIN:
        # Horovod: scale learning rate by the number of workers.
        optimizer = tf.train.MomentumOptimizer(learning_rate=0.01 * hvd.size(), momentum=0.9)
        optimizer = hvd.DistributedOptimizer(optimizer)
        train_op = optimizer.minimize(loss=loss, global_step=tf.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode=mode, loss=loss, train_op=train_op)
    eval_metric_ops = {"accuracy": tf.metrics.accuracy(labels=labels, predictions=predictions["classes"])}
    return tf.estimator.EstimatorSpec(mode=mode, loss=loss, eval_metric_ops=eval_metric_ops)


def main(_):
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", required=True)
    p.add_argument("--steps", type=int, default=400)
    args, _ = p.parse_known_args()
    hvd.init()
    rng = np.random.RandomState(hvd.rank())
    train_data = rng.rand(4096, 64).astype("float32")
    train_labels = (train_data.sum(axis=1) > 32).astype("int32")
    eval_data = np.random.RandomState(99).rand(1000, 64).astype("float32")
    eval_labels = (eval_data.sum(axis=1) > 32).astype("int32")

    config = tf.ConfigProto()
    config.gpu_options.allow_growth = True
    config.gpu_options.visible_device_list = str(hvd.local_rank())
    # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
    model_dir = args.model_dir if hvd.rank() == 0 else tempfile.mkdtemp()
    classifier = tf.estimator.Estimator(model_fn=model_fn, model_dir=model_dir,
                                        config=tf.estimator.RunConfig(session_config=config))
    bcast_hook = hvd.BroadcastGlobalVariablesHook(0)
    train_input_fn = tf.estimator.inputs.numpy_input_fn(x={"x": train_data}, y=train_labels, batch_size=100,
                                                        num_epochs=None, shuffle=True)
    classifier.train(input_fn=train_input_fn, steps=args.steps // hvd.size(), hooks=[bcast_hook])
    eval_input_fn = tf.estimator.inputs.numpy_input_fn(x={"x": eval_data}, y=eval_labels, num_epochs=1,
                                                       shuffle=False)
    results = classifier.evaluate(input_fn=eval_input_fn)
    weights = sum(float(np.abs(classifier.get_variable_value(n)).sum()) for n in classifier.get_variable_names()
                  if n.endswith("kernel"))
    print("rank {}: accuracy {:.3f} at global step {}, weights {:.6f}".format(
        hvd.rank(), results["accuracy"], results["global_step"], weights), flush=True)


if __name__ == "__main__":
    tf.app.run()
