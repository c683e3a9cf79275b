"""A TF 1.x program that turns a compiled tf.keras model into an Estimator and trains it with train_and_evaluate.

    python keras_to_estimator.py --model_dir DIR [--max_steps N] [--parameter_server_strategy | --collective]
                                 [--gpus N]

``--parameter_server_strategy`` names TF 1.x's strategy in the RunConfig, as the TF 1.11-1.13 programs did:
``RunConfig(train_distribute=tf.contrib.distribute.ParameterServerStrategy())``; ``--collective`` names
``CollectiveAllReduceStrategy()`` in a ``DistributeConfig``, with ``MirroredStrategy()`` to evaluate; ``--gpus N``
gives both ``num_gpus_per_worker=N``, as the issue's public program did.

Trainers print ``STEPS <task> <local steps>``; the evaluator prints ``EVAL <metrics as JSON>``.
"""

import argparse
import json

import numpy as np
import tensorflow as tf

rng = np.random.RandomState(2)
X = rng.rand(512, 6).astype(np.float32)
Y = (X[:, :3].sum(axis=1) > 1.5).astype(np.int64)


def build_model():
    inputs = tf.keras.Input(shape=(6,), name="features")
    hidden = tf.keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    outputs = tf.keras.layers.Dense(2, activation="softmax", name="probabilities")(hidden)
    model = tf.keras.Model(inputs, outputs)
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


class StepCounter(tf.train.SessionRunHook):
    def __init__(self):
        self.steps = 0

    def after_run(self, run_context, run_values):
        self.steps += 1


def make_estimator(model_dir, strategy=None, collective=False, gpus=None):
    if collective:
        per_worker = {} if gpus is None else {"num_gpus_per_worker": gpus}
        config = tf.estimator.RunConfig(
            save_checkpoints_steps=100, log_step_count_steps=100,
            experimental_distribute=tf.contrib.distribute.DistributeConfig(
                train_distribute=tf.contrib.distribute.CollectiveAllReduceStrategy(**per_worker),
                eval_distribute=tf.contrib.distribute.MirroredStrategy(**per_worker)))
    else:
        config = tf.estimator.RunConfig(save_checkpoints_steps=100, log_step_count_steps=100,
                                        train_distribute=strategy)
    return tf.keras.estimator.model_to_estimator(keras_model=build_model(), model_dir=model_dir, config=config)


def eval_input():
    return tf.estimator.inputs.numpy_input_fn({"features": X}, Y, batch_size=128, shuffle=False)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--max_steps", type=int, default=300)
    p.add_argument("--parameter_server_strategy", action="store_true")
    p.add_argument("--collective", action="store_true")
    p.add_argument("--gpus", type=int)
    args = p.parse_args()
    strategy = tf.contrib.distribute.ParameterServerStrategy() if args.parameter_server_strategy else None
    estimator = make_estimator(args.model_dir, strategy, args.collective, args.gpus)
    config = estimator.config
    counter = StepCounter()
    train_input = tf.estimator.inputs.numpy_input_fn({"features": X}, Y, batch_size=32, num_epochs=None,
                                                     shuffle=True)
    result, _ = tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(train_input, max_steps=args.max_steps, hooks=[counter]),
        tf.estimator.EvalSpec(eval_input(), steps=None, start_delay_secs=0, throttle_secs=1))
    if config.task_type in ("chief", "master", "worker"):
        print(f"STEPS {config.task_type}:{config.task_id} {counter.steps}", flush=True)
    if result is not None:
        print("EVAL " + json.dumps({k: float(v) for k, v in result.items()}), flush=True)


if __name__ == "__main__":
    main()
