"""fit's epochs and training metrics: passes over the data, and metrics every replica adds to.

As the tutorials' custom training loop has them: ``epochs`` instead of steps (the steps of an epoch from
the data's size and the global batch), and ``train_accuracy`` accumulated over every replica's examples,
reported at each epoch's end and reset.
"""

import os
import re
import subprocess
import sys

import pytest

from conftest import TFCLUSTER, base_env

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _fit_job as job  # noqa: E402

from tfcluster.core.errors import SpecError  # noqa: E402
from tfcluster.training.train import fit  # noqa: E402


def sgd():
    return tf1.train.GradientDescentOptimizer(0.5)


def test_epochs_are_passes_over_the_data_and_each_ends_with_the_training_metrics(data, tmp_path, caplog):
    caplog.set_level("INFO", logger="tfcluster")
    result = fit(job.make_model_fn(data), job.make_input_fn(data), optimizer=sgd, epochs=2, batch_size=32,
                 checkpoint_dir=str(tmp_path), save_checkpoint_secs=None, log_every_secs=60)
    assert result.global_step == 2 * 512 // 32                    # 512 examples, 32 a step, twice
    ends = re.findall(r"local epoch (\d) of 2 done \(global step (\d+)\): train accuracy (\S+)", caplog.text)
    assert [(e, int(s)) for e, s, _ in ends] == [("1", 16), ("2", 32)]
    assert all(0.0 <= float(a) <= 1.0 for _, _, a in ends)


def test_epochs_need_a_known_data_size_and_steps_or_epochs_one_of_them(data, tmp_path):
    repeated = (lambda ctx: job.make_input_fn(data)(ctx).repeat())
    with pytest.raises(SpecError, match="epochs needs the size of the data"):
        fit(job.make_model_fn(data), repeated, optimizer=sgd, epochs=1, batch_size=32)
    result = fit(job.make_model_fn(data), repeated, optimizer=sgd, epochs=1, batch_size=32, examples_per_epoch=64,
                 checkpoint_dir=str(tmp_path), save_checkpoint_secs=None, log_every_secs=60)
    assert result.global_step == 2
    with pytest.raises(SpecError, match="steps or epochs, one of them"):
        fit(job.make_model_fn(data), repeated, optimizer=sgd, steps=3, epochs=1, batch_size=32)


# Each worker's examples carry its input pipeline's id; the metric is their mean. On the ps the totals are
# shared, so the chief's figure counts worker:1's examples too: in sync, every step has as many of each, so
# the mean is 1/2 (give or take the next step's examples of a worker that did not wait for the report),
# where a worker counting alone would report 0.
SHARED = r'''
import sys
import tensorflow as tf
import tfcluster
from tfcluster import Mode, ModelOutput
from tfcluster.core.logs import setup_cli_logging
tf1 = tf.compat.v1
tf1.disable_eager_execution()
setup_cli_logging()

def model_fn(features, labels, mode):
    w = tf1.get_variable("w", [2, 2])
    logits = tf.matmul(features, w)
    loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return ModelOutput(predictions=tf.argmax(logits, 1), per_example_loss=loss,
                       metrics={"from_worker_1": tf1.metrics.mean(features[:, 1])})

def input_fn(ctx):
    ds = tf.data.Dataset.range(512).map(lambda i: (tf.stack([1.0, tf.cast(ctx.input_pipeline_id, tf.float32)]),
                                                   tf.cast(i % 2, tf.int32)))
    return ctx.shard(ds).batch(ctx.per_replica_batch, drop_remainder=True)

tfcluster.fit(model_fn, input_fn, optimizer=lambda: tf1.train.GradientDescentOptimizer(0.1), epochs=2,
              batch_size=8, strategy="sync", log_every_secs=60)
'''


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_training_metrics_on_the_ps_count_every_workers_examples(tmp_path):
    script = tmp_path / "shared.py"
    script.write_text(SHARED)
    r = subprocess.run(TFCLUSTER + ["local", "--ps", "1", "--workers", "2", "--log-dir", str(tmp_path / "logs"),
                                    "--", sys.executable, str(script)], capture_output=True, text=True,
                       cwd=str(tmp_path), env=base_env(), timeout=170)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    figures = [float(v) for v in re.findall(r"\[worker:0\] .*epoch \d of 2 done .*from_worker_1 (\S+)", r.stdout)]
    assert len(figures) == 2, r.stdout[-3000:]
    assert all(abs(f - 0.5) < 0.05 for f in figures), figures
