"""Horovod's TF 1.x graph programs in TF1 mode, on TF's collectives between tfcluster's tasks (no horovod package).

- Horovod's tensorflow_mnist.py, as Horovod writes it (``hvd.init``, ``DistributedOptimizer``,
  ``BroadcastGlobalVariablesHook(0)``, a ``MonitoredTrainingSession`` without a target, a GPU pinned by local
  rank, checkpoints on rank 0), on ``tfcluster local --tf1 --ps 0 --workers 2``: ranks 0 and 1 of 2, both copies
  the same bit for bit, and equal to one process on the global batch (``op=Average``: the mean of the ranks'
  mean gradients is the global batch's), also with ``backward_passes_per_step=2`` and
  ``gradient_predivide_factor=2``, with ``op=Sum`` (one process at twice the rate) and with
  ``Compression.fp16`` (within its rounding, and half the bytes in a traced step's all-reduce); allgather of
  unequal lengths, alltoall with splits, a prescaled Sum, grouped_allreduce, reducescatter,
  broadcast_object and allgather_object give what Horovod documents;
- ``backward_passes_per_step=k`` sums k passes' gradients and applies them on the k-th, the global step (and
  a Keras optimizer's ``iterations``) counting every pass;
- Horovod's tensorflow_keras_mnist.py with its four callbacks, started by ``tfcluster horovodrun -np 2``: one
  model, the warmup and
  schedule rates Horovod's formulas give, each epoch's loss averaged over the ranks, and rank 0's checkpoint
  loaded back by ``hvd.load_model`` with its optimizer wrapped again;
- Horovod's tensorflow_mnist_estimator.py on 2 workers: each rank's Estimator trains alone (``hvd.init()``
  takes TF_CONFIG's cluster for the ranks, as horovodrun sets none), the copies the same, rank 0 saving;
- faults: a killed rank ends the run within a second, named in one line (its peer's collective fails at
  once); under ``--max-restarts`` every rank restarts together from rank 0's checkpoint, rank 1 taking it by
  the broadcast, and the copies end identical; a step's collectives start no thread (TF's per-op timeout
  started two, each sleeping 300 s, and a fast program ran out of threads within a minute);
- a call before ``hvd.init()``, ``hvd.Adasum``, ``hvd.elastic`` and bad optimizer arguments are one line
  each, exit 2;
- a program's ``visible_device_list`` gives way to the GPUs tfcluster gave the task.
"""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, TFCLUSTER, base_env, no_process_left, run_cli, run_local
from jobs.stream import Stream

PROGRAM = os.path.join(REPO, "tests", "programs", "horovod_mnist.py")
#: The program's trainable floats: dense 64x32 + 32, dense 32x2 + 2.
PARAMS = 64 * 32 + 32 + 32 * 2 + 2


def weights(folder, rank):
    with np.load(os.path.join(folder, f"weights-{rank}.npz")) as f:
        return [f[f"arr_{i}"] for i in range(len(f.files))]


def in_tf1_mode(script, *args):
    """``python -m tfcluster.tf1 SCRIPT ARGS`` in one process (a rank of one), to its end."""
    return subprocess.run([sys.executable, "-m", "tfcluster.tf1", str(script), *map(str, args)], capture_output=True,
                          text=True, timeout=150, env=base_env())


def written(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return tmp_path / name


def one_process(out, *args):
    r = in_tf1_mode(PROGRAM, "--out", out, *args)
    assert r.returncode == 0 and "rank 0 of 1 (local rank 0, host 0 of 1)" in r.stdout, r.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("options", [["--trace"], ["--passes", "2", "--predivide", "2", "--collectives"],
                                     ["--fp16", "--trace"], ["--op", "sum"]],
                         ids=["average", "two-passes-predivided", "fp16", "sum"])
def test_horovods_mnist_program_trains_one_model_on_two_workers_equal_to_one_process_on_the_global_batch(
        tmp_path, options, reliability):
    code, out = run_local(tmp_path, "--tf1", "--ps", "0", "--workers", "2", "--", sys.executable, PROGRAM,
                          "--out", tmp_path / "cluster", *options)
    assert code == 0, out[-4000:]
    for rank in (0, 1):
        assert re.search(rf"^\[worker:{rank}\] rank {rank} of 2 \(local rank {rank}, host 0 of 1\): 20 steps$", out,
                         re.M), \
            out[-4000:]
        if "--collectives" in options:
            assert f"[worker:{rank}] rank {rank}: collectives agree" in out, out[-4000:]
    assert os.listdir(tmp_path / "cluster" / "checkpoints")         # rank 0 saved
    if "--trace" in options:
        # What a traced step's all-reduce carried: every gradient (64x32 + 32 + 32x2 + 2 floats) in one op, in
        # 4 bytes each, or 2 with Compression.fp16 (a ring of n ranks sends 2(n-1)/n of it each).
        carried = {int(m.group(1)): (int(m.group(2)), m.group(3)) for m in re.finditer(
            r"^\[worker:\d\] rank (\d) all-reduced (\d+) bytes in a step \((\S+)\)$", out, re.M)}
        width, dtype = (2, "float16") if "--fp16" in options else (4, "float32")
        assert carried == {0: (PARAMS * width, dtype), 1: (PARAMS * width, dtype)}, out[-3000:]
        reliability(f"Horovod {dtype}: bytes one rank all-reduces per step (traced)", carried[0][0], "B")
    # op=Sum: the sum of the 2 ranks' mean gradients is twice the global batch's mean, one process's at twice the rate.
    one_process(tmp_path / "one", *[o for o in options if o not in ("--collectives", "--trace")],
                *(["--lr", "0.2"] if "sum" in options else []))
    for a, b, c in zip(weights(tmp_path / "cluster", 0), weights(tmp_path / "cluster", 1),
                       weights(tmp_path / "one", 0)):
        np.testing.assert_array_equal(a, b)
        # The same sums in another order (two halves' means averaged, against one mean): float32 rounding; with
        # fp16, each gradient rounded to 11 bits, summed in float16 there and not here.
        np.testing.assert_allclose(a, c, **(dict(rtol=1e-2, atol=1e-3) if "--fp16" in options else
                                             dict(rtol=1e-5, atol=1e-6)))


def last_words(run, n=30):
    """The launcher's and rank 0's last lines: rank 1's traceback fills a run's tail and hides what rank 0 did."""
    return "\n".join(m.string for _, m in run.matches(r"^\[(?:tfcluster|worker:0)\]")[-n:])


def started_pid(run, task):
    return int(run.wait_for(rf"^\[tfcluster\] {task} (?:started|restarted) \(pid (\d+)\)", 1)[1].group(1))


@pytest.mark.slow
@pytest.mark.serial         # seconds from a kill are measured
@pytest.mark.timeout(300)
def test_a_killed_rank_ends_the_run_at_once_and_max_restarts_resumes_every_rank_from_rank_0s_checkpoint(
        procs, tmp_path, reliability):
    def launch(*options, out):
        return Stream(procs.start(TFCLUSTER + ["local", "--tf1", "--ps", "0", "--workers", "2", *options,
                                               "--log-dir", str(tmp_path / out / "logs"), "--", "python", PROGRAM,
                                               "--out", str(tmp_path / out), "--steps", "6000", "--save-steps", "500",
                                               "--print-every", "250"], cwd=str(tmp_path)), f"horovod {out}")
    # No restarts: the run ends, naming the rank, while its peer would wait in an all-reduce.
    run = launch(out="once")
    run.wait_for(r"^\[worker:1\] rank 1 step 1000$", 150)
    t_kill = time.monotonic()
    os.kill(started_pid(run, "worker:1"), signal.SIGKILL)
    assert run.finish(timeout=60) == 128 + signal.SIGKILL, run.tail()
    t_end = run.lines[-1][0]
    assert run.matches(r"^\[tfcluster\] error: worker:1 was killed by SIGKILL")
    reliability("Horovod: seconds from a rank's kill to the launcher's exit", t_end - t_kill, "s")
    assert t_end - t_kill < 15, run.tail()

    # --max-restarts: both ranks start again at rank 0's last checkpoint (rank 1 by the broadcast).
    run = launch("--max-restarts", "1", out="restarts")
    run.wait_for(r"^\[worker:1\] rank 1 step (\d+)$", 150, check=lambda m: int(m.group(1)) >= 1750)
    t_kill = time.monotonic()
    os.kill(started_pid(run, "worker:1"), signal.SIGKILL)
    t_restart, _ = run.wait_for(r"worker:1 was killed by SIGKILL; its all-reduce group cannot take it back alone, "
                                r"so every trainer restarts", 30, after=t_kill)
    assert run.finish(timeout=150) == 0, last_words(run) + "\n...\n" + run.tail()
    starts = {rank: [int(m.group(1)) for _, m in run.matches(rf"^\[worker:{rank}\] rank {rank} starts at global "
                                                             r"step (\d+)$")]
              for rank in (0, 1)}
    assert starts[0] == starts[1] and starts[0][0] == 0 and 1500 <= starts[0][1] <= 6000, starts
    killed_at = max(int(m.group(1)) for _, m in run.matches(r"^\[worker:1\] rank 1 step (\d+)$", before=t_kill))
    reliability("Horovod --max-restarts: seconds from a rank's kill to every rank restarting", t_restart - t_kill,
                "s")
    reliability("Horovod --max-restarts: steps lost (the kill's step less the checkpoint resumed)",
                max(0, killed_at - starts[0][1]), "steps")
    for a, b in zip(weights(tmp_path / "restarts", 0), weights(tmp_path / "restarts", 1)):
        np.testing.assert_array_equal(a, b)
    for rank in (0, 1):
        first, last = (int(x) for x in run.wait_for(rf"^\[worker:{rank}\] rank {rank}: (\d+) threads after the "
                                                     r"first step, (\d+) at the end$", 1)[1].groups())
        assert last - first < 50, (first, last)       # thousands when each collective started a thread


AGGREGATION = """
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hk

hvd.init()
x = tf.placeholder(tf.float32, [])
w = tf.Variable(10.0)
step = tf.train.get_or_create_global_step()
opt = hvd.DistributedOptimizer(tf.train.GradientDescentOptimizer(1.0), backward_passes_per_step=2)
train = opt.minimize(w * x, global_step=step)
with tf.Session() as s:
    s.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
    for v in (1.0, 2.0, 3.0, 4.0):
        s.run(train, {x: v})
        print("train", s.run(w), s.run(step))

model = tf.keras.Sequential([tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones", input_shape=(1,))])
model.compile(loss="mae", optimizer=hk.DistributedOptimizer(tf.keras.optimizers.SGD(1.0), backward_passes_per_step=2,
                                                           average_aggregated_gradients=True))
model.fit(np.array([[1.0], [2.0], [3.0], [4.0]], "float32"), np.full((4, 1), -100.0, "float32"), batch_size=1,
          shuffle=False, verbose=0)
print("keras", model.get_weights()[0].item(), tf.keras.backend.get_value(model.optimizer.iterations))
"""


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_backward_passes_sum_k_gradients_and_apply_them_on_the_kth_pass_while_the_step_counts_every_pass(tmp_path):
    r = in_tf1_mode(written(tmp_path, "aggregation.py", AGGREGATION))
    assert r.returncode == 0, r.stderr[-3000:]
    # loss w * x, rate 1: passes 1 and 2 (x = 1, 2) apply -3 on the second; passes 3 and 4 apply -7.
    assert re.findall(r"^train (\S+) (\d+)$", r.stdout, re.M) == [
        ("10.0", "1"), ("7.0", "2"), ("7.0", "3"), ("0.0", "4")], r.stdout
    # |w x + 100| by fit, one example a batch, averaged over the 2 passes: 1 - (1+2)/2 - (3+4)/2 = -4.
    assert "keras -4.0 4" in r.stdout, r.stdout


ESTIMATOR_PROGRAM = os.path.join(REPO, "tests", "programs", "horovod_estimator.py")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_horovods_estimator_program_trains_one_model_on_two_workers_each_an_estimator_of_its_own(tmp_path):
    code, out = run_local(tmp_path, "--tf1", "--ps", "0", "--workers", "2", "--", sys.executable,
                          ESTIMATOR_PROGRAM, "--model-dir", tmp_path / "model")
    assert code == 0, out[-4000:]
    said = {int(m.group(1)): m.groups()[1:] for m in re.finditer(
        r"^\[worker:\d\] rank (\d): accuracy (\S+) at global step (\d+), weights (\S+)$", out, re.M)}
    # Each rank's Estimator trains alone, as under horovodrun (hvd.init() took TF_CONFIG's cluster for its ranks):
    # 400 // 2 steps each, the same copy (Horovod's all-reduce), rank 0 the only one writing --model-dir.
    assert set(said) == {0, 1} and said[0] == said[1] and said[0][1] == "200", out[-4000:]
    assert any(f.startswith("model.ckpt-200") for f in os.listdir(tmp_path / "model"))


KERAS_PROGRAM = os.path.join(REPO, "tests", "programs", "horovod_keras.py")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_horovods_keras_program_with_its_callbacks_started_by_horovodrun_trains_one_model_on_two_workers(
        tmp_path):
    # Started as Horovod's users start it: tfcluster horovodrun -np 2 python train.py.
    # On a machine whose GPUs 2 and 5 are free (a fake list: this one has none), each rank gets one of them.
    r = run_cli("horovodrun", "-np", "2", sys.executable, KERAS_PROGRAM, "--out", tmp_path / "out", timeout=240,
                cwd=str(tmp_path), env=base_env(CUDA_VISIBLE_DEVICES="2,5"))
    out = r.stdout + r.stderr
    assert no_process_left([int(m) for m in re.findall(r"started \(pid (\d+)\)", out)])
    assert r.returncode == 0, out[-4000:]
    assert out.startswith(f"[tfcluster] horovodrun is: tfcluster local --tf1 --ps 0 --workers 2 -- {sys.executable} "
                          f"{KERAS_PROGRAM} --out {tmp_path / 'out'}\n"), out[:500]
    for a, b in zip(weights(tmp_path / "out", 0), weights(tmp_path / "out", 1)):
        np.testing.assert_array_equal(a, b)
    # The program pins GPU str(hvd.local_rank()); the task sees only its own GPU, as GPU 0, so the pin gives way.
    for rank, gpu in ((0, "2"), (1, "5")):
        assert f"[worker:{rank}] rank {rank}: CUDA_VISIBLE_DEVICES={gpu}, the session's visible_device_list=''" \
            in out, out[-4000:]
    epochs = {rank: re.findall(rf"^\[worker:{rank}\] rank {rank} epoch (\d): lr (\S+) loss (\S+)$", out, re.M)
              for rank in (0, 1)}
    # Each epoch's loss is the ranks' mean, the same on both (MetricAverageCallback), and so are the rates.
    assert epochs[0] == epochs[1] and len(epochs[0]) == 4, out[-4000:]
    # The rate 0.05 * size = 0.1, warmed up over 2 epochs from 0.1 / 2 (Horovod's formula at each epoch's last
    # of its 16 batches: (e + 1) / 2 * (2 - 1) / 2 + 1, over 2), then halved from epoch 2 by the schedule.
    assert [float(lr) for _, lr, _ in epochs[0]] == [0.075, 0.1, 0.05, 0.05], epochs[0]
    assert "[worker:0] restored SGD (tfcluster.horovod.optimizers)" in out, out[-4000:]
    assert (tmp_path / "out" / "checkpoint-4.h5").exists()


NAMES = """
import tensorflow as tf
import keras
from keras import backend as K
from tensorflow.keras.models import Sequential
import horovod.keras as hvd
from horovod.tensorflow.keras.callbacks import MetricAverageCallback

assert keras.layers.Dense is tf.keras.layers.Dense and Sequential is tf.keras.models.Sequential
assert K.set_session is tf.keras.backend.set_session      # TF 1.x's tf.keras.backend, not TF 2's
assert hvd.callbacks.MetricAverageCallback is MetricAverageCallback
hvd.init()
opt = hvd.DistributedOptimizer(keras.optimizers.Adadelta(1.0 * hvd.size()))
assert type(opt).__name__ == "Adadelta" and isinstance(opt, keras.optimizers.Adadelta), type(opt).__mro__
print("served")
"""


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_import_keras_and_tensorflow_keras_are_tf1_modes_tf_keras_and_horovod_keras_wraps_their_optimizers(tmp_path):
    r = in_tf1_mode(written(tmp_path, "names.py", NAMES))
    assert r.returncode == 0 and "served" in r.stdout, r.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("line, message", [
    ("hvd.size()", r"hvd\.size\(\) before hvd\.init\(\): call hvd\.init\(\) first"),
    ("hvd.init(); hvd.allreduce(tf.constant(1.0), op=hvd.Adasum)", r"hvd\.Adasum is not covered"),
    ("hvd.init(); hvd.DistributedOptimizer(tf.train.AdamOptimizer(), op=hvd.Sum, gradient_predivide_factor=2.0)",
     r"hvd\.DistributedOptimizer\(gradient_predivide_factor=\.\.\.\) needs op=hvd\.Average"),
    ("hvd.init(); hvd.DistributedOptimizer(tf.train.AdamOptimizer(), backward_passes_per_step=0)",
     r"hvd\.DistributedOptimizer\(backward_passes_per_step=0\): give a whole number of passes, 1 or more"),
    ("hvd.elastic.run", r"horovod\.tensorflow\.elastic\.run is not covered by tfcluster's Horovod; use "
                        r"tfcluster local --max-restarts"),
    ("hvd.init(); hvd.DistributedOptimizer(tf.train.AdamOptimizer(), process_set=object())",
     r"hvd\.DistributedOptimizer\(process_set=\.\.\.\) is not covered"),
    ("hvd.init(); hvd.join()", r"hvd\.join\(\) is not covered: give every rank the same number of steps"),
], ids=["before-init", "adasum", "predivide-sum", "no-passes", "elastic", "process-set", "join"])
def test_what_is_not_served_is_one_line(tmp_path, line, message):
    program = f"import tensorflow as tf\nimport horovod.tensorflow as hvd\n{line}\n"
    r = in_tf1_mode(written(tmp_path, "program.py", program))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert re.search(rf"^tfcluster: error: {message}", r.stderr, re.M), r.stderr[-3000:]


@pytest.mark.slow
def test_a_programs_gpu_pinning_gives_way_to_the_gpus_tfcluster_gave_the_task(monkeypatch):
    import tensorflow as tf
    from tfcluster.tf1.robust import _under
    base = tf.compat.v1.ConfigProto(device_filters=["/job:worker/task:1"])
    pinned = tf.compat.v1.ConfigProto()
    pinned.gpu_options.visible_device_list = "1"          # hvd.local_rank() on the second task of a host
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")        # the one GPU tfcluster gave it
    assert _under(pinned, base).gpu_options.visible_device_list == ""
    assert list(_under(pinned, base).device_filters) == ["/job:worker/task:1"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _under(pinned, base).gpu_options.visible_device_list == "1"
