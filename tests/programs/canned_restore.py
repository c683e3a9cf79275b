"""A TF 1.x program that picks up model directories TF 1.x's canned estimators wrote, under TF1 mode.

    python canned_restore.py BASE OUT.json

For each model dir under BASE (scripts/canned_reference.py's models), with the same columns and arguments:
predict (``before``), train 10 more steps from the checkpoint, evaluate, predict again (``after``). Then a new
model warm-started from the first one's weights (``warm``).
"""

import importlib.util
import json
import os
import sys

import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "canned_reference", os.path.join(HERE, "..", "..", "scripts", "canned_reference.py"))
reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reference)

base, out = sys.argv[1], sys.argv[2]
got = {}
for name in reference.MODELS:
    model_dir = os.path.join(base, name)
    model = reference.build(tf, tf.estimator, name, model_dir)
    train, predict = reference.input_fns(tf, tf.estimator, name)
    before = reference.predictions(model, predict)
    model.train(train, steps=10)
    metrics = model.evaluate(train, steps=2)
    got[name] = {"before": before, "after": reference.predictions(model, predict),
                 "global_step": int(model.get_variable_value("global_step")),
                 "variables": model.get_variable_names(), "metrics": sorted(metrics)}
# A new model dir warm-started from the first model's: with a learning rate of 0, one step leaves TF 1.x's weights.
warm = reference.build(tf, tf.estimator, "dnn", os.path.join(base, "warm"), optimizer=tf.train.AdagradOptimizer(0.0),
                       warm_start_from=tf.estimator.WarmStartSettings(os.path.join(base, "dnn"), ".*hiddenlayer.*|.*logits.*|.*embedding.*"))
train, predict = reference.input_fns(tf, tf.estimator, "dnn")
warm.train(train, steps=1)
got["warm"] = {"predictions": reference.predictions(warm, predict), "global_step": int(warm.get_variable_value("global_step"))}
with open(out, "w") as f:
    json.dump(got, f)
