"""Horovod's TF 1.x graph programs in TF1 mode, on TF's collectives between tfcluster's tasks (no horovod package).

- Horovod's tensorflow_mnist.py, as Horovod writes it (``hvd.init``, ``DistributedOptimizer``,
  ``BroadcastGlobalVariablesHook(0)``, a ``MonitoredTrainingSession`` without a target, a GPU pinned by local
  rank, checkpoints on rank 0), on ``tfcluster local --tf1 --ps 0 --workers 2``: ranks 0 and 1 of 2, both copies
  the same bit for bit, and equal to one process on the global batch (``op=Average``: the mean of the ranks'
  mean gradients is the global batch's);
- a call before ``hvd.init()``, ``hvd.Adasum`` and the modules not served yet (``horovod.tensorflow.keras``,
  ``hvd.elastic``) are one line each, exit 2;
- a program's ``visible_device_list`` gives way to the GPUs tfcluster gave the task.
"""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, base_env, run_local

PROGRAM = os.path.join(REPO, "tests", "programs", "horovod_mnist.py")


def weights(folder, rank):
    with np.load(os.path.join(folder, f"weights-{rank}.npz")) as f:
        return [f[f"arr_{i}"] for i in range(len(f.files))]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_horovods_mnist_program_trains_one_model_on_two_workers_equal_to_one_process_on_the_global_batch(tmp_path):
    code, out = run_local(tmp_path, "--tf1", "--ps", "0", "--workers", "2", "--", sys.executable, PROGRAM,
                          "--out", tmp_path / "cluster")
    assert code == 0, out[-4000:]
    for rank in (0, 1):
        assert re.search(rf"^\[worker:{rank}\] rank {rank} of 2 \(local rank {rank}, host 0 of 1\): 20 steps$", out,
                         re.M), \
            out[-4000:]
    assert os.listdir(tmp_path / "cluster" / "checkpoints")         # rank 0 saved
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf1", PROGRAM, "--out", str(tmp_path / "one")],
                       capture_output=True, text=True, timeout=150, env=base_env())
    assert r.returncode == 0 and "rank 0 of 1 (local rank 0, host 0 of 1)" in r.stdout, r.stderr[-3000:]
    for a, b, c in zip(weights(tmp_path / "cluster", 0), weights(tmp_path / "cluster", 1),
                       weights(tmp_path / "one", 0)):
        np.testing.assert_array_equal(a, b)
        # The same sums in another order (two halves' means averaged, against one mean): float32 rounding.
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("line, message", [
    ("hvd.size()", r"hvd\.size\(\) before hvd\.init\(\): call hvd\.init\(\) first"),
    ("hvd.init(); hvd.allreduce(tf.constant(1.0), op=hvd.Adasum)", r"hvd\.Adasum is not covered"),
    ("import horovod.tensorflow.keras as hk; hk.init()",
     r"horovod\.tensorflow\.keras\.init is not covered by tfcluster's Horovod yet"),
    ("hvd.elastic.run", r"horovod\.tensorflow\.elastic\.run is not covered by tfcluster's Horovod yet; use "
                        r"tfcluster local --max-restarts"),
], ids=["before-init", "adasum", "keras", "elastic"])
def test_what_is_not_served_is_one_line(tmp_path, line, message):
    script = tmp_path / "program.py"
    script.write_text(f"import tensorflow as tf\nimport horovod.tensorflow as hvd\n{line}\n")
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf1", str(script)], capture_output=True, text=True,
                       timeout=150, env=base_env())
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
