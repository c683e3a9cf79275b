"""TF2 mode: a tf.distribute program of TF 2.0-2.15 runs unchanged on TF 2.21, one model across the cluster.

- each name of docs/tf2.md's table works in TF2 mode (one row, one test), and the names TF removed fail
  without it, as the table says;
- the custom-loop tutorial's program (``MirroredStrategy``, ``experimental_run_v2``) trains one model over
  two workers of ``tfcluster local --tf2``: both end with the same weights, those of one process mirroring
  over two devices on the same global batches; the unused ps is named;
- the Keras tutorial's program (a ``Sequential`` without input shape, compiled in a ``MirroredStrategy``'s
  scope, ``fit`` on numpy arrays) trains one model over two workers;
- checkpoints do not race: a non-chief's ``checkpoint.save``, ``CheckpointManager.save`` and ``save_weights``
  are written aside and removed, the chief's land where the program says, and restore in one process;
- TF's own multi-worker Keras tutorial (``MultiWorkerMirroredStrategy`` from TF_CONFIG) trains one model over
  two workers, and TF 2's ``ParameterServerStrategy`` tutorial (a ``ClusterCoordinator`` loop, or ``fit``)
  trains on ``--chief --ps 1 --workers 2`` with every task ending when the chief is done;
- a program with no strategy on a cluster of several trainers says once that each trains a private copy;
- bad strategy arguments: ``NcclAllReduce`` without GPUs and a device name TF cannot parse are one line
  (exit 2); a device the machine lacks is one warning, and TF runs its replica on the CPU;
- without tf-keras (Keras 3), the custom loop as Keras 3 spells it trains one model over two workers; the
  Keras tutorial's ``fit`` runs in one process, and on two workers (which Keras 3's fit does not support) is
  one line naming the ``legacy`` extra, as is a Keras 2 name the custom loop uses (``reset_states()``);
- the README's example (examples/tf2_digits.py, both loops) trains one model over two workers, and its
  chief alone reports a test accuracy above 0.9;
- a TF 2 Estimator program (TF 2.0-2.3's ``ParameterServerStrategy()``, the multi-worker Estimator
  tutorial) is one line naming ``--tf1`` in TF2 mode, and trains under ``--tf1``;
- the mode's command line: ``--tf2`` rewrites ``python script.py``, refuses what is not a Python script and
  ``--tf1`` beside it, each in one line.
"""

import json
import os
import re
import subprocess
import sys
import socket
import tempfile
import threading
import time

import numpy as np
import pytest

from conftest import REPO, base_env, run_cli, run_local
from tfcluster.core.errors import TfclusterError
from tfcluster.tf2 import tf2_command
from tfcluster.tf2.names import NAMES, table
from tfcluster.tf2.servers import CHIEF_GONE_LOOKS, CHIEF_POLL_SECS, wait_for_chief_to_end

pytestmark = pytest.mark.slow

CUSTOM_LOOP = os.path.join(REPO, "tests", "programs", "tf2_custom_loop.py")
KERAS_FIT = os.path.join(REPO, "tests", "programs", "tf2_keras_fit.py")
MULTI_WORKER = os.path.join(REPO, "tests", "programs", "tf2_multi_worker.py")
KERAS_TUTORIAL = os.path.join(REPO, "tests", "programs", "tf2_keras_tutorial.py")
MULTI_WORKER_LOOP = os.path.join(REPO, "tests", "programs", "tf2_multi_worker_custom_loop.py")
SAVE_AND_LOAD = os.path.join(REPO, "tests", "programs", "tf2_save_and_load.py")
DISTRIBUTED_INPUT = os.path.join(REPO, "tests", "programs", "tf2_distributed_input.py")
PARAMETER_SERVER = os.path.join(REPO, "tests", "programs", "tf2_parameter_server.py")
ESTIMATOR = os.path.join(REPO, "tests", "programs", "tf2_estimator.py")
EXAMPLE = os.path.join(REPO, "examples", "tf2_digits.py")
NO_STRATEGY = """
import tensorflow as tf
model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
optimizer = tf.keras.optimizers.SGD(0.1)
for _ in range(3):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.ones((4, 2))))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
print("trained", flush=True)
"""

#: A machine without tf-keras, as a sitecustomize on PYTHONPATH makes one: importing tf_keras fails as it would there.
NO_TF_KERAS = """
import sys
class NoTfKeras:
    def find_spec(self, name, path=None, target=None):
        if name == "tf_keras" or name.startswith("tf_keras."):
            raise ModuleNotFoundError("No module named %r" % name, name=name)
sys.meta_path.insert(0, NoTfKeras())
"""

#: Each row's example under a MirroredStrategy, in one process: ``<i> ok`` or ``<i> <error type>: <message>``.
PROBE = """
import sys
import numpy as np
import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
for i, line in enumerate(sys.argv[1:]):
    try:
        with strategy.scope():
            eval(line)
        print(i, "ok", flush=True)
    except Exception as e:
        print(i, type(e).__name__ + ":", str(e).splitlines()[0] if str(e) else "", flush=True)
"""


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """``(in TF2 mode, without it)``: each row's answer, ``{index: "ok" or the error}``."""
    script = tmp_path_factory.mktemp("probe") / "probe.py"
    script.write_text(PROBE)
    answers = []
    for mode in (["-m", "tfcluster.tf2"], []):
        r = subprocess.run([sys.executable, *mode, str(script), *[n.example for n in NAMES]], capture_output=True,
                           text=True, timeout=150, env=base_env())
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        answers.append(dict(line.split(" ", 1) for line in r.stdout.splitlines() if re.match(r"\d+ ", line)))
    return answers


@pytest.mark.timeout(200)
@pytest.mark.parametrize("row", range(len(NAMES)), ids=[n.name.split("(")[0] for n in NAMES])
def test_each_name_of_the_table_works_in_tf2_mode_and_a_removed_one_fails_without_it(probed, row):
    in_mode, without = probed
    if "--tf1" in NAMES[row].served:       # the Estimator's names: TF1 mode's, said in one line
        assert re.match(r"TF1Mode(Name|Import): ", in_mode[str(row)]) and "with --tf1" in in_mode[str(row)], \
            in_mode[str(row)]
    else:
        assert in_mode[str(row)] == "ok", NAMES[row]
    if NAMES[row].tf_221 in ("AttributeError", "TypeError", "ImportError"):
        assert without[str(row)].startswith(NAMES[row].tf_221), without[str(row)]
    else:
        assert without[str(row)] == "ok", (NAMES[row], without[str(row)])


def test_docs_tf2_md_holds_the_table_of_names():
    text = open(os.path.join(REPO, "docs", "tf2.md")).read()
    block = re.search(r"<!-- names -->\n(.*?)<!-- /names -->", text, re.S)
    assert block and block.group(1) == table(), "docs/tf2.md is stale: paste tfcluster.tf2.names.table()"


SAVES = """
import os, sys
import tensorflow as tf
folder = sys.argv[1]
model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
checkpoint = tf.train.Checkpoint(model=model)
print("saved", checkpoint.save(os.path.join(folder, "ckpt")))
manager = tf.train.CheckpointManager(checkpoint, os.path.join(folder, "managed"), max_to_keep=2)
print("managed", manager.save())
model.save_weights(os.path.join(folder, "weights", "w"))
print("latest", tf.train.latest_checkpoint(folder))
"""


def files_under(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


@pytest.mark.timeout(300)
def test_a_non_chief_writes_its_checkpoints_aside_and_the_chief_where_the_program_says(tmp_path):
    script = tmp_path / "saves.py"
    script.write_text(SAVES)
    folder = tmp_path / "saves"
    temp = tmp_path / "temp"                    # the tasks' TMPDIR: where a non-chief's writes aside go
    temp.mkdir()
    env = base_env(TMPDIR=str(temp))
    code, out = run_local(tmp_path, "--tf2", "--ps", "0", "--workers", "2", "--timeout", "200", "--",
                          sys.executable, script, folder, timeout=260, env=env)
    assert code == 0, out[-3000:]
    # Either way the program is told the chief's path, its bookkeeping names the chief's checkpoint, and a
    # non-chief's call returns once the chief's write is whole: its latest_checkpoint sees it.
    for task in ("worker:0", "worker:1"):
        for line in (f"saved {folder}/ckpt-1", f"managed {folder}/managed/ckpt-2", f"latest {folder}/ckpt-1"):
            assert f"[{task}] {line}" in out, out[-3000:]
    assert {"checkpoint", "ckpt-1.index", "managed/checkpoint", "managed/ckpt-2.index",
            "weights/w.index"} <= set(files_under(folder)), files_under(folder)
    assert not [n for n in os.listdir(temp) if "tfcluster-checkpoint" in n]      # written aside, then removed


RESTORE = """
import sys
import numpy as np
import tensorflow as tf
init = tf.keras.initializers.GlorotUniform
model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(4, 3, activation="relu", input_shape=(8, 8, 1), kernel_initializer=init(1)),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(16, activation="relu", kernel_initializer=init(2)),
    tf.keras.layers.Dense(2, kernel_initializer=init(3)),
])
tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(sys.argv[1])).expect_partial()
np.savez(sys.argv[2], *[v.numpy() for v in model.trainable_variables])
"""


def weights(folder, name):
    with np.load(os.path.join(folder, f"weights-{name}.npz")) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


@pytest.mark.timeout(300)
def test_the_custom_loop_tutorial_trains_one_model_over_two_workers_as_one_process_over_two_devices(tmp_path):
    cluster_out, one_out = tmp_path / "cluster", tmp_path / "one"
    ckpt = tmp_path / "training_checkpoints"
    code, out = run_local(tmp_path, "--tf2", "--workers", "2", "--timeout", "200", "--",
                          sys.executable, CUSTOM_LOOP, "--out", cluster_out, "--ckpt", ckpt, timeout=260)
    assert code == 0, out[-4000:]
    # The program's own MirroredStrategy, now the cluster's: two replicas, one per worker; the ps is named idle.
    assert re.search(r"\[worker:0\] tfcluster: info: MirroredStrategy on a cluster of 2 trainers: one model over all of them.*"
                     r"the 1 ps task\(s\) are unused \(--ps 0 leaves them out\)", out), out[-4000:]
    assert len(re.findall(r"\[worker:\d\] Number of devices: 2$", out, re.M)) == 2, out[-4000:]
    w0, w1 = weights(cluster_out, "worker-0"), weights(cluster_out, "worker-1")
    for a, b in zip(w0, w1):
        np.testing.assert_array_equal(a, b)         # one model: the same variables' values, bit for bit
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", CUSTOM_LOOP, "--out", str(one_out),
                        "--logical-cpus", "2"], capture_output=True, text=True, timeout=150, env=base_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Number of devices: 2" in r.stdout
    # The same sums in another order of operations (a ring all-reduce against one device's sum): float32 rounding.
    for a, b in zip(w0, weights(one_out, "local-0")):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Every worker saved where the tutorial says; the chief's checkpoint is the one there, and restores without
    # a strategy in one process to the model the cluster trained.
    assert len(re.findall(rf"saved {ckpt}/ckpt-1 latest {ckpt}/ckpt-1$", out, re.M)) == 2, out[-3000:]
    script = tmp_path / "restore.py"
    script.write_text(RESTORE)
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", str(script), str(ckpt), str(tmp_path / "restored.npz")],
                       capture_output=True, text=True, timeout=150, env=base_env())
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(tmp_path / "restored.npz") as f:
        for a, b in zip(w0, [f[f"arr_{i}"] for i in range(len(f.files))]):
            np.testing.assert_array_equal(a, b)


def one_model_on_two_workers(tmp_path, program, out_dir, *args, env=None):
    """``program --out out_dir ARGS`` under ``tfcluster local --tf2 --ps 0 --workers 2`` (in ``env``): it exits 0
    and both workers hold the same weights, bit for bit. Returns the run's output."""
    code, out = run_local(tmp_path, "--tf2", "--ps", "0", "--workers", "2", "--timeout", "200", "--",
                          sys.executable, program, "--out", out_dir, *args, timeout=260, env=env)
    assert code == 0, out[-4000:]
    for a, b in zip(weights(out_dir, "worker-0"), weights(out_dir, "worker-1")):
        np.testing.assert_array_equal(a, b)
    return out


@pytest.mark.timeout(300)
def test_the_keras_tutorial_compiled_in_a_mirrored_scope_fits_one_model_over_two_workers_as_one_process(tmp_path):
    out = one_model_on_two_workers(tmp_path, KERAS_FIT, tmp_path / "cluster", "--same-batches")
    assert len(re.findall(r"\[worker:\d\] Number of devices: 2 \(Keras 2 \(tf-keras\)\)$", out, re.M)) == 2, out[-4000:]
    assert "ps task" not in out                      # --ps 0: nothing unused to name
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", KERAS_FIT, "--out", str(tmp_path / "one"),
                        "--logical-cpus", "2", "--same-batches"], capture_output=True, text=True, timeout=150,
                       env=base_env())
    assert r.returncode == 0 and "Number of devices: 2" in r.stdout, r.stderr[-3000:]
    # As for the custom loop: the same global batches from the same start, summed in another order (float32).
    for a, b in zip(weights(tmp_path / "cluster", "worker-0"), weights(tmp_path / "one", "local-0")):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


#: The Keras tutorial's SavedModels loaded in one process, no strategy: ``<keras model> <tf.saved_model> <out.npz>``.
LOAD_SAVED = """
import sys
import numpy as np
import tensorflow as tf
images = np.random.RandomState(0).randint(0, 256, (384, 28, 28, 1)).astype("uint8")[256:] / 255.0
keras = tf.keras.models.load_model(sys.argv[1]).predict(images, verbose=0)
exported = tf.saved_model.load(sys.argv[2]).signatures["serving_default"]
np.savez(sys.argv[3], keras=keras, exported=list(exported(tf.constant(images, tf.float32)).values())[0].numpy())
"""


def batch_logs(out: str, prefix: str = "") -> dict:
    """``{"epoch.batch": (loss, accuracy)}``: what the Keras tutorial's program printed after each batch."""
    return {m.group(1): (float(m.group(2)), float(m.group(3))) for m in
            re.finditer(rf"^{re.escape(prefix)}batch (\d+\.\d+) loss (\S+) accuracy (\S+)$", out, re.M)}


def progress_as_one_process(out: str, one_out: str, batches: int) -> None:
    """Each worker's ``batch`` lines in ``out`` are one process's (``one_out``): the same batches, the same values."""
    one = batch_logs(one_out)
    assert len(one) == batches, one_out[-2000:]
    for task in ("worker:0", "worker:1"):
        on_cluster = batch_logs(out, f"[{task}] ")
        assert sorted(on_cluster) == sorted(one), out[-3000:]
        for batch, values in one.items():
            np.testing.assert_allclose(on_cluster[batch], values, rtol=1e-5, atol=1e-6, err_msg=f"{task} {batch}")


@pytest.mark.timeout(400)
def test_the_keras_tutorial_with_its_data_made_before_the_strategy_trains_prints_and_saves_as_one_process(tmp_path):
    # TF's "Distributed training with Keras": datasets first, then MirroredStrategy, fit with its callbacks,
    # model.save(path) and tf.saved_model.save on every worker, each loaded back.
    cluster = tmp_path / "cluster"
    out = one_model_on_two_workers(tmp_path, KERAS_TUTORIAL, cluster, "--same-batches")
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", KERAS_TUTORIAL, "--out", str(tmp_path / "one"),
                        "--logical-cpus", "2", "--same-batches"], capture_output=True, text=True, timeout=200,
                       env=base_env())
    assert r.returncode == 0 and "Number of devices: 2" in r.stdout, r.stderr[-3000:]
    for a, b in zip(weights(cluster, "worker-0"), weights(tmp_path / "one", "local-0")):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # What Keras reports after each batch (its progress bar's values) is one process's, on every worker.
    progress_as_one_process(out, r.stdout, batches=16)
    # Both workers saved; the chief's SavedModels are where the program says, whole, and predict in one process
    # without a strategy what the cluster's model predicts.
    assert len(re.findall(r"^\[worker:\d\] Unreplicated eval loss", out, re.M)) == 2, out[-3000:]
    script = tmp_path / "load.py"
    script.write_text(LOAD_SAVED)
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", str(script), str(cluster / "saved_model"),
                        str(cluster / "exported"), str(tmp_path / "loaded.npz")], capture_output=True, text=True,
                       timeout=150, env=base_env())
    assert r.returncode == 0, r.stderr[-3000:]
    predicted = np.load(cluster / "predictions-worker-0.npy")
    with np.load(tmp_path / "loaded.npz") as loaded:
        np.testing.assert_allclose(loaded["keras"], predicted, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(loaded["exported"], predicted, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(400)
def test_tfs_multi_worker_custom_loop_tutorial_keeps_its_own_checkpoints_apart_and_trains_as_one_process(tmp_path):
    # The tutorial writes a non-chief's CheckpointManager into workertemp_<id> and removes it after each save:
    # TF2 mode leaves those paths alone (it broke the tutorial's own rmtree when it wrote them aside).
    cluster = tmp_path / "cluster"
    out = one_model_on_two_workers(tmp_path, MULTI_WORKER_LOOP, cluster, "--same-batches")
    assert re.search(rf"^\[worker:0\] replicas 2 saved {cluster}/ckpt$", out, re.M), out[-3000:]
    assert re.search(rf"^\[worker:1\] replicas 2 saved {cluster}/workertemp_1/ckpt$", out, re.M), out[-3000:]
    assert not (cluster / "workertemp_1" / "ckpt").exists()             # removed by the tutorial itself
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", MULTI_WORKER_LOOP, "--out", str(tmp_path / "one"),
                        "--num-workers", "2", "--same-batches"], capture_output=True, text=True, timeout=200,
                       env=base_env())
    assert r.returncode == 0, r.stderr[-3000:]
    for a, b in zip(weights(cluster, "worker-0"), weights(tmp_path / "one", "local-0")):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # The chief's checkpoint, where the tutorial says, restores in one process without a strategy.
    script = tmp_path / "restore.py"
    script.write_text(RESTORE_LOOP)
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", str(script), str(cluster / "ckpt"),
                        str(tmp_path / "restored.npz")], capture_output=True, text=True, timeout=150, env=base_env())
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(tmp_path / "restored.npz") as f:
        for a, b in zip(weights(cluster, "worker-0"), [f[f"arr_{i}"] for i in range(len(f.files))]):
            np.testing.assert_array_equal(a, b)


#: The multi-worker custom loop's model restored from its chief's checkpoint in one process: ``<dir> <out.npz>``.
RESTORE_LOOP = """
import sys
import numpy as np
import tensorflow as tf
model = tf.keras.Sequential([tf.keras.Input(shape=(28, 28)), tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
                             tf.keras.layers.Conv2D(8, 3, activation="relu"), tf.keras.layers.Flatten(),
                             tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(10)])
tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(sys.argv[1])).expect_partial()
np.savez(sys.argv[2], *[v.numpy() for v in model.trainable_variables])
"""


@pytest.mark.timeout(400)
def test_tfs_save_and_load_tutorial_saves_and_loads_under_and_across_strategies_as_one_process(tmp_path):
    # Keras's save and load with no strategy and in a OneDeviceStrategy (a second all-reduce strategy of the
    # process on a cluster), tf.saved_model's export called in another MirroredStrategy's run, and the save
    # and load "to the local device" with experimental_io_device="/job:localhost".
    cluster = tmp_path / "cluster"
    code, out = run_local(tmp_path, "--tf2", "--ps", "0", "--workers", "2", "--timeout", "300", "--",
                          sys.executable, SAVE_AND_LOAD, "--out", cluster, "--same-batches", timeout=360)
    assert code == 0, out[-4000:]
    assert len(re.findall(r"^\[worker:\d\] saved and loaded$", out, re.M)) == 2, out[-3000:]
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", SAVE_AND_LOAD, "--out", str(tmp_path / "one"),
                        "--logical-cpus", "2", "--same-batches"], capture_output=True, text=True, timeout=300,
                       env=base_env())
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(cluster / "predictions-worker-0.npz") as w0, np.load(cluster / "predictions-worker-1.npz") as w1, \
            np.load(tmp_path / "one" / "predictions-local-0.npz") as one:
        assert sorted(w0.files) == sorted(one.files) == ["io_device", "io_device_fresh", "keras_loaded", "trained"]
        for name in one.files:
            np.testing.assert_array_equal(w0[name], w1[name], err_msg=name)     # one model on both workers
            np.testing.assert_allclose(w0[name], one[name], rtol=1e-5, atol=1e-5, err_msg=name)
        # What was saved is what was trained: the model loaded back predicts as the trained one.
        np.testing.assert_allclose(w0["keras_loaded"], w0["trained"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(w0["io_device"], w0["io_device_fresh"], rtol=1e-6, atol=1e-6)


@pytest.mark.timeout(400)
def test_tfs_distributed_input_tutorial_shares_each_global_batch_out_over_the_workers_as_one_process(tmp_path):
    cluster = tmp_path / "cluster"
    code, out = run_local(tmp_path, "--tf2", "--ps", "0", "--workers", "2", "--timeout", "200", "--",
                          sys.executable, DISTRIBUTED_INPUT, "--out", cluster, timeout=260)
    assert code == 0, out[-4000:]
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", DISTRIBUTED_INPUT, "--out", str(tmp_path / "one"),
                        "--logical-cpus", "2"], capture_output=True, text=True, timeout=200, env=base_env())
    assert r.returncode == 0, r.stderr[-3000:]
    w0, w1 = (json.loads((cluster / f"ids-worker-{i}.json").read_text()) for i in range(2))
    one = json.loads((tmp_path / "one" / "ids-local-0.json").read_text())
    everything = list(range(64))
    # A dataset the strategy distributes (a for loop, iter and next, the DATA policy) and one a function makes
    # per input pipeline: each step's global batch is one process's, shared out over the workers, none twice.
    for way in ("for", "next", "function", "DATA"):
        assert [sorted(a + b) for a, b in zip(w0[way], w1[way])] == one[way], way
        assert not set(sum(w0[way], [])) & set(sum(w1[way], [])), way
    # FILE: each worker reads whole files of its own (TF's policy), every example once over the cluster.
    assert sorted(sum(w0["FILE"] + w1["FILE"], [])) == everything
    assert {i // 16 for i in sum(w0["FILE"], [])} == {0, 2} and {i // 16 for i in sum(w1["FILE"], [])} == {1, 3}
    # OFF: no sharding, as TF says: each worker reads all of it.
    assert sorted(sum(w0["OFF"], [])) == sorted(sum(w1["OFF"], [])) == everything


#: A machine without TensorBoard (TF 2.21 does not install it): importing tensorboard fails as it would there.
NO_TENSORBOARD = NO_TF_KERAS.replace("tf_keras", "tensorboard")

TENSORBOARD = """
import sys
import tensorflow as tf
model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
model.compile("sgd", "mse")
model.fit(tf.ones((4, 2)), tf.ones((4, 1)), callbacks=[tf.keras.callbacks.TensorBoard(log_dir=sys.argv[1])], verbose=0)
print("fitted", flush=True)
"""


@pytest.mark.timeout(200)
def test_the_tutorials_tensorboard_callback_runs_and_without_tensorboard_is_one_line_naming_the_legacy_extra(tmp_path):
    program = tmp_path / "tensorboard_callback.py"      # not tensorboard.py: it would shadow the package
    program.write_text(TENSORBOARD)
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", str(program), str(tmp_path / "logs")],
                       capture_output=True, text=True, timeout=150, env=base_env())
    assert r.returncode == 0 and "fitted" in r.stdout, r.stderr[-3000:]
    assert list((tmp_path / "logs" / "train").iterdir()), "the callback wrote no event file"
    folder = tmp_path / "no_tensorboard"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(NO_TENSORBOARD)
    env = base_env()
    env["PYTHONPATH"] = f"{folder}{os.pathsep}{env['PYTHONPATH']}"
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", str(program), str(tmp_path / "logs2")],
                       capture_output=True, text=True, timeout=150, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert re.search(r"^tfcluster: error: TensorBoard is not installed.*2\.21 does not; install it with tfcluster's "
                     r"legacy extra \(pip install 'tfcluster\[legacy\]'\)", r.stderr, re.M), r.stderr[-3000:]


DATA_FIRST = """
import tensorflow as tf
x = tf.random.uniform((4, 2), seed=1)
strategy = tf.distribute.MirroredStrategy()
print("built", strategy.num_replicas_in_sync)
"""


@pytest.mark.timeout(300)
def test_a_strategy_after_the_first_tensor_on_a_parameter_server_cluster_is_one_line(tmp_path):
    # --chief with ps tasks is TF 2's ParameterServerStrategy's shape: its workers start servers of their own,
    # so TF2 mode cannot start the all-reduce's first; a one-process strategy built after data is one line.
    program = tmp_path / "data_first.py"
    program.write_text(DATA_FIRST)
    code, out = run_local(tmp_path, "--tf2", "--chief", "--ps", "1", "--workers", "1", "--timeout", "200", "--",
                          sys.executable, program, timeout=260)
    assert code != 0 and "Traceback" not in out, out[-3000:]
    # Whichever trainer gets there first says it (the launcher then stops the others).
    assert re.search(r"^\[(chief|worker):0\] tfcluster: error: \1:0: the all-reduce strategy was built after the "
                     r"program's first tensor.*start the cluster without --chief", out, re.M), out[-3000:]


def without_tf_keras(tmp_path) -> dict:
    """base_env() of a machine where tf-keras is not installed (TF's tf.keras is then Keras 3)."""
    folder = tmp_path / "no_tf_keras"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(NO_TF_KERAS)
    env = base_env()
    env.pop("TF_USE_LEGACY_KERAS", None)
    env["PYTHONPATH"] = f"{folder}{os.pathsep}{env['PYTHONPATH']}"
    return env


@pytest.mark.timeout(300)
def test_without_tf_keras_the_custom_loop_written_for_keras_3_trains_one_model_over_two_workers(tmp_path):
    # The tutorial's loop as a Keras 3 user edits it: Keras 3 spells a metric's reset reset_state().
    program = tmp_path / "custom_loop_keras3.py"
    program.write_text(open(CUSTOM_LOOP, encoding="utf-8").read().replace(".reset_states()", ".reset_state()"))
    one_model_on_two_workers(tmp_path, program, tmp_path / "cluster", env=without_tf_keras(tmp_path))


@pytest.mark.timeout(300)
def test_without_tf_keras_fit_on_two_workers_is_one_line_naming_the_legacy_extra_and_runs_in_one_process(tmp_path):
    env = without_tf_keras(tmp_path)
    code, out = run_local(tmp_path, "--tf2", "--ps", "0", "--workers", "2", "--timeout", "200", "--",
                          sys.executable, KERAS_FIT, "--out", tmp_path / "cluster", timeout=260, env=env)
    assert code == 2, out[-4000:]
    assert re.search(r"^\[worker:\d\] tfcluster: error: Keras 3's fit does not run under MultiWorkerMirroredStrategy"
                     r", the one model over this cluster's trainers \(keras-team/keras#20585\); install Keras 2 with "
                     r"tfcluster's legacy extra \(pip install 'tfcluster\[legacy\]', tf-keras\)", out, re.M), out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    alone = subprocess.run([sys.executable, "-m", "tfcluster.tf2", KERAS_FIT, "--out", str(tmp_path / "one")],
                           capture_output=True, text=True, timeout=150, env=env)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert re.search(r"^Number of devices: 1 \(Keras 3\.", alone.stdout, re.M), alone.stdout


@pytest.mark.timeout(300)
def test_without_tf_keras_a_keras_2_name_the_program_uses_is_one_line_naming_the_legacy_extra(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", CUSTOM_LOOP, "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=150, env=without_tf_keras(tmp_path))
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert re.search(r"^tfcluster: error: 'SparseCategoricalAccuracy' object has no attribute 'reset_states': the "
                     r"program was written for Keras 2 \(TF 2\.0-2\.15's tf\.keras\), and tf\.keras here is Keras 3; "
                     r"install Keras 2 with tfcluster's legacy extra \(pip install 'tfcluster\[legacy\]', tf-keras\)",
                     r.stderr, re.M), r.stderr[-3000:]


@pytest.mark.timeout(300)
def test_tfs_multi_worker_keras_tutorial_trains_one_model_and_the_chief_alone_keeps_its_save(tmp_path):
    out_dir = tmp_path / "out"
    out = one_model_on_two_workers(tmp_path, MULTI_WORKER, out_dir, "--same-batches")
    assert len(re.findall(r"\[worker:\d\] replicas 2 saved ", out)) == 2, out[-4000:]
    assert sorted(os.listdir(out_dir)) == ["keras-model", "weights-worker-0.npz", "weights-worker-1.npz"]
    # The same global batches in one process (TF's strategy with no TF_CONFIG: one worker, one device): the
    # same model, and what Keras printed after each batch on either worker is what one process prints.
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", MULTI_WORKER, "--out", str(tmp_path / "one"),
                        "--num-workers", "2", "--same-batches"], capture_output=True, text=True, timeout=200,
                       env=base_env())
    assert r.returncode == 0, r.stderr[-3000:]
    for a, b in zip(weights(out_dir, "worker-0"), weights(tmp_path / "one", "None-None")):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    progress_as_one_process(out, r.stdout, batches=10)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("loop", ["coordinator", "fit"])
def test_tfs_parameter_server_tutorial_trains_on_the_ps_and_every_task_ends_with_the_chief(tmp_path, loop):
    code, out = run_local(tmp_path, "--tf2", "--chief", "--ps", "1", "--workers", "2", "--timeout", "200", "--",
                          sys.executable, PARAMETER_SERVER, "--out", tmp_path / "out",
                          *(["--fit"] if loop == "fit" else []), timeout=260)
    assert code == 0, out[-4000:]
    assert re.search(r"^\[chief:0\] chief done: step 16$", out, re.M), out[-4000:]
    # TF's workers serve for ever; here each returns from server.join() once the chief ended, then the ps goes.
    for i in range(2):
        assert re.search(rf"^\[worker:{i}\] tfcluster: info: worker:{i}: its chief \(chief:0\) ended: "
                         r"server\.join\(\) returns$", out, re.M), out[-4000:]
    assert "[tfcluster] done: 3 trainer(s) succeeded" in out


@pytest.mark.timeout(30)
def test_a_task_in_server_join_sees_a_chief_that_served_for_a_moment_end_and_waits_for_one_not_yet_up():
    # The fit tutorial's chief serves for about a second (stop 60's CI: a worker that looked once a second
    # missed all of it and sat in join() until --timeout).
    server = socket.socket()
    server.bind(("127.0.0.1", 0))               # bound, not listening: nothing answers yet
    address = "127.0.0.1:%d" % server.getsockname()[1]
    ended = threading.Event()
    waiter = threading.Thread(target=lambda: (wait_for_chief_to_end(address), ended.set()), daemon=True)
    waiter.start()
    time.sleep(1.5)
    assert not ended.is_set()                   # a chief not yet up is waited for
    server.listen()
    time.sleep(0.5)
    server.close()                              # served for half a second
    assert ended.wait(CHIEF_POLL_SECS * (CHIEF_GONE_LOOKS + 2))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_the_readmes_tf2_example_trains_one_model_over_two_workers_and_the_chief_reports_its_accuracy(tmp_path,
                                                                                                     loop):
    code, out = run_local(tmp_path, "--tf2", "--ps", "0", "--workers", "2", "--", sys.executable, EXAMPLE,
                          "--loop", loop)
    assert code == 0, out[-4000:]
    assert re.search(r"^\[worker:\d\] tfcluster: info: MirroredStrategy on a cluster of 2 trainers: one model over all of them", out,
                     re.M), out[-4000:]
    accuracy = re.findall(r"^\[worker:(\d)\] test accuracy: ([\d.]+)$", out, re.M)
    assert [task for task, _ in accuracy] == ["0"], out[-4000:]          # the chief alone
    assert float(accuracy[0][1]) > 0.9, out[-4000:]      # 297 held-out digits (measured: fit 0.95; one process 0.98)


ESTIMATOR_CLUSTERS = {"parameter_server": ["--chief", "--ps", "1", "--workers", "1"],
                      "multi_worker": ["--ps", "0", "--workers", "2"]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", sorted(ESTIMATOR_CLUSTERS))
def test_a_tf2_estimator_program_is_tf1_modes_it_trains_there_and_tf2_mode_says_so_in_one_line(tmp_path, strategy):
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf2", ESTIMATOR, "--strategy", strategy, "--model-dir",
                        str(tmp_path / "one")], capture_output=True, text=True, timeout=120, env=base_env())
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert re.search(r"^tfcluster: error: .* run the program with --tf1 \(tfcluster local --tf1 ", r.stderr, re.M)
    code, out = run_local(tmp_path, "--tf1", *ESTIMATOR_CLUSTERS[strategy], "--", sys.executable, ESTIMATOR,
                          "--strategy", strategy, "--model-dir", tmp_path / "model")
    assert code == 0, out[-4000:]
    assert len(re.findall(r"^\[\w+:\d\] trained: ", out, re.M)) == 2, out[-4000:]      # both trainers
    saved = re.search(r'^model_checkpoint_path: ".*-(\d+)"$', (tmp_path / "model" / "checkpoint").read_text(), re.M)
    assert int(saved.group(1)) >= 40, out[-4000:]       # max_steps; in async training a last step may land after


@pytest.mark.timeout(300)
def test_a_program_with_no_strategy_on_two_workers_says_once_that_each_trains_a_private_copy(tmp_path):
    script = tmp_path / "no_strategy.py"
    script.write_text(NO_STRATEGY)
    code, out = run_local(tmp_path, "--tf2", "--ps", "0", "--workers", "2", "--timeout", "200", "--",
                          sys.executable, script, timeout=260)
    assert code == 0, out[-4000:]
    for i in range(2):
        said = re.findall(rf"^\[worker:{i}\] tfcluster: warning: worker:{i} trains a private copy of its model: no "
                          r"tf\.distribute strategy holds it on this cluster of 2 trainers", out, re.M)
        assert len(said) == 1, out[-4000:]
    alone = subprocess.run([sys.executable, "-m", "tfcluster.tf2", str(script)], capture_output=True, text=True,
                           timeout=150, env=base_env())
    assert alone.returncode == 0 and "trained" in alone.stdout and "private copy" not in alone.stderr, alone.stderr


DEVICES = """
import sys
import tensorflow as tf
strategy = tf.distribute.MirroredStrategy(sys.argv[1:])
with strategy.scope():
    v = tf.Variable(1.0)
print("replicas", strategy.num_replicas_in_sync, "variable on", v.device.split("/")[-1], flush=True)
"""


@pytest.mark.timeout(200)
def test_a_device_the_machine_lacks_is_one_warning_and_a_name_tf_cannot_parse_one_line(tmp_path):
    script = tmp_path / "devices.py"
    script.write_text(DEVICES)

    def run(*devices):
        return subprocess.run([sys.executable, "-m", "tfcluster.tf2", str(script), *devices], capture_output=True,
                              text=True, timeout=120, env=base_env())
    r = run("/gpu:0", "/gpu:1")         # a program written for a machine with two GPUs, here: TF runs it on the CPU
    assert r.returncode == 0 and "replicas 2 variable on device:CPU:0" in r.stdout, r.stderr[-3000:]
    assert re.search(r"^tfcluster: warning: MirroredStrategy\(devices=\['/gpu:0', '/gpu:1'\]\): /gpu:0, /gpu:1 are "
                     r"not on this machine \(it has [^)]*\): TF places those replicas on the CPU$", r.stderr, re.M), \
        r.stderr[-3000:]
    r = run("gpu0")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert re.search(r"^tfcluster: error: MirroredStrategy\(devices=\['gpu0'\]\): 'gpu0' is not a device name "
                     r"\(.*\); name devices as '/gpu:0', '/cpu:0'$", r.stderr, re.M), r.stderr[-3000:]


@pytest.mark.timeout(300)
def test_nccl_all_reduce_asked_of_a_cluster_without_gpus_is_refused_in_one_line(tmp_path):
    script = tmp_path / "nccl.py"
    script.write_text("import tensorflow as tf\n"
                      "strategy = tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce())\n")
    code, out = run_local(tmp_path, "--tf2", "--ps", "0", "--workers", "2", "--timeout", "200", "--",
                          sys.executable, script, timeout=260)
    assert code == 2, out[-4000:]
    # Both workers refuse it; the first to exit ends the run, and the other may be stopped before it says so.
    assert re.search(r"\[worker:\d\] tfcluster: error: cross_device_ops=NcclAllReduce\(\) needs GPUs, and this "
                     r"machine has none", out), out[-4000:]
    assert "Traceback" not in out


def test_tf2_rewrites_a_python_command_and_refuses_anything_else_in_one_line():
    assert tf2_command(["python", "train.py", "--x", "1"]) == ["python", "-m", "tfcluster.tf2", "train.py", "--x", "1"]
    assert tf2_command(["python3", "-u", "-m", "pkg.train"]) == ["python3", "-u", "-m", "tfcluster.tf2", "-m",
                                                                  "pkg.train"]
    with pytest.raises(TfclusterError, match=r"^--tf2 runs Python scripts: .* \(got 'bash'\)"):
        tf2_command(["bash", "train.sh"])


@pytest.mark.parametrize("args, message", [
    (["--tf1", "--tf2", "--", "python", "train.py"], "--tf1 and --tf2 exclude each other"),
    (["--tf2", "--", "bash", "train.sh"], "--tf2 runs Python scripts"),
])
def test_bad_tf2_command_lines_get_one_line_and_exit_2(tmp_path, args, message):
    r = run_cli("local", *args, cwd=str(tmp_path))
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
