"""``tfcluster local --tf1`` forks its TF1-mode tasks from one process that imported TensorFlow once.

Each TF1-mode task is a real process of its own (its pid, its process group, its environment, its output), forked
from the run's fork server (tfcluster/tf1/forkserver.py) instead of importing TensorFlow, tf-keras and the
Estimator itself (~8 s of CPU a task). ``--no-fork`` starts each as its own Python process. These tests check that
the forked tasks train one model as started ones do, and that restarts, exit codes and the launcher's death treat
them as they treat any task.
"""

import json
import os
import re
import signal
import sys

import psutil
import pytest

from conftest import base_env, no_process_left, run_local
from test_local import Run
from tfcluster.core.errors import TfclusterError
from tfcluster.launch.forked import ForkServer

PROGRAM = r'''
import json, os, random, sys, time
CPU_AT_START = time.process_time()       # a fork starts at 0; a Python process of its own has imported TF first
import numpy as np
import tensorflow as tf
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
print("FORKED " + json.dumps({"task": task, "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0),
                              "cpu": CPU_AT_START, "random": random.random(), "numpy": float(np.random.rand())}),
      flush=True)
cluster = tf.train.ClusterSpec(config["cluster"])
server = tf.train.Server(cluster, job_name=task["type"], task_index=task["index"])
with tf.device(tf.train.replica_device_setter(cluster=cluster)):
    step = tf.train.get_or_create_global_step()
    total = tf.Variable(0.0)
    train = tf.group(tf.assign_add(total, 1.0), tf.assign_add(step, 1))
with tf.train.MonitoredTrainingSession(master=server.target, is_chief=task["index"] == 0) as session:
    for _ in range(20):
        session.run(train)
    print("TOTAL %d" % session.run(total), flush=True)
'''


def forked(out):
    """Each task's FORKED line, by task name."""
    lines = (json.loads(x) for x in re.findall(r"^\[\S+\] FORKED (\{.*\})$", out, re.M))
    return {f"{d['task']['type']}:{d['task']['index']}": d for d in lines}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fork", [True, False], ids=["forked", "no-fork"])
def test_two_tf1_workers_train_one_model_forked_from_one_server_or_each_on_its_own(tmp_path, fork, reliability):
    (tmp_path / "train.py").write_text(PROGRAM)
    code, out = run_local(tmp_path, "--tf1", "--ps", "1", "--workers", "2", *([] if fork else ["--no-fork"]),
                          "--", "python", "train.py", timeout=200)
    assert code == 0, out[-3000:]
    tasks = forked(out)
    assert set(tasks) == {"worker:0", "worker:1"}, out[-3000:]      # the ps is tfcluster's own server (forked too)
    # One model: both workers' 20 steps went into the ps's variable.
    assert max(int(x) for x in re.findall(r"^\[worker:\d\] TOTAL (\d+)$", out, re.M)) == 40, out[-3000:]
    server = re.search(r"^\[tfcluster\] TF1 fork server started \(pid (\d+)\)", out, re.M)
    reliability(f"{'forked' if fork else '--no-fork'}: a worker's CPU seconds before its script's first line",
                max(task["cpu"] for task in tasks.values()), "s")
    for name, task in tasks.items():
        assert task["pgid"] == task["pid"], name       # a process group of its own, which the launcher signals
        assert f"[tfcluster] {name} started (pid {task['pid']})" in out
    if fork:
        assert server, out[-3000:]
        assert "TF1 fork server started (pid %s): ps:0, worker:0, worker:1 are forked" % server.group(1) in out
        for name, task in tasks.items():
            assert task["ppid"] == int(server.group(1)), name
            assert task["cpu"] < 1.0, (name, task["cpu"])      # no import of its own before the script
        # Each fork draws its own random numbers, as processes of their own do.
        assert tasks["worker:0"]["random"] != tasks["worker:1"]["random"]
        assert tasks["worker:0"]["numpy"] != tasks["worker:1"]["numpy"]
    else:
        assert server is None and "TF1 fork server" not in out
        for name, task in tasks.items():
            assert task["cpu"] > 2.0, (name, task["cpu"])      # it imported TensorFlow itself first


CRASHES_ONCE = r'''
import json, os, signal, sys, time
print("pid", os.getpid(), flush=True)
first = os.environ["TFCLUSTER_RESTART_COUNT"] == "0"
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
printed = os.environ.get("WORKER0_PRINTED")      # a file worker:0 makes once its first pid line is out
if index == 0 and first and printed:
    open(printed, "w").close()
    time.sleep(60)      # still running when worker:1 dies: the trainers (no ps) restart together
if index == 1 and first:
    # The group restart stops worker:0 too: it must have printed its first pid line by then.
    deadline = time.time() + 60
    while printed and not os.path.exists(printed) and time.time() < deadline:
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
'''


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_forked_task_killed_by_sigkill_is_forked_again_and_the_run_completes(tmp_path):
    (tmp_path / "crash.py").write_text(CRASHES_ONCE)
    code, out = run_local(tmp_path, "--tf1", "--ps", "0", "--workers", "2", "--max-restarts", "1",
                          "--", "python", "crash.py", timeout=150,
                          env=base_env(WORKER0_PRINTED=str(tmp_path / "worker0-printed")))
    assert code == 0, out[-3000:]
    assert "worker:1 was killed by SIGKILL" in out, out[-3000:]
    for worker in (0, 1):           # no ps: an all-reduce group, restarted together
        restarted = re.search(rf"^\[tfcluster\] worker:{worker} restarted \(pid (\d+)\)", out, re.M)
        assert restarted, out[-3000:]
        pids = [int(p) for p in re.findall(rf"^\[worker:{worker}\] pid (\d+)$", out, re.M)]
        assert len(pids) == 2 and pids[1] == int(restarted.group(1)), out[-3000:]
    assert "done: 2 trainer(s) succeeded; restarts: worker:0 1, worker:1 1" in out, out[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_forked_tasks_exit_code_and_last_error_are_its_own(tmp_path):
    (tmp_path / "crash.py").write_text(CRASHES_ONCE)
    (tmp_path / "fails.py").write_text("raise ValueError('the data has no label column')\n")
    code, out = run_local(tmp_path, "--tf1", "--ps", "0", "--workers", "1", "--", "python", "fails.py",
                          timeout=150)
    assert code == 1, out[-3000:]
    assert "worker:0 exited with code 1 (ValueError: the data has no label column)" in out, out[-3000:]
    assert "[worker:0] Traceback (most recent call last):" in out
    code, out = run_local(tmp_path, "--tf1", "--ps", "0", "--workers", "1", "--", "python", "crash.py",
                          timeout=150)
    assert code == 0, out[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_launcher_killed_by_sigkill_takes_its_fork_server_and_forked_tasks_with_it(tmp_path, procs):
    (tmp_path / "forever.py").write_text("import os, time\nprint('pid', os.getpid(), flush=True)\n"
                                         "while True:\n    time.sleep(1)\n")
    run = Run(procs, ["--tf1", "--ps", "0", "--workers", "2", "--log-dir", tmp_path / "logs", "--",
                      "python", "forever.py"], tmp_path)
    run.wait_for(r"^\[worker:1\] pid \d+$", 150)
    run.wait_for(r"^\[worker:0\] pid \d+$", 30)
    server = int(re.search(r"TF1 fork server started \(pid (\d+)\)", run.output).group(1))
    tasks = run.pids("worker:0") + run.pids("worker:1")
    assert all(psutil.Process(pid).ppid() == server for pid in tasks)
    os.kill(run.proc.pid, signal.SIGKILL)       # the launcher only
    run.proc.wait(10)
    # Linux's death signals: the server dies with the launcher, each task with the server.
    assert no_process_left([server] + tasks, timeout=10), "the fork server or a task outlived the launcher"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_while_the_fork_server_imports_tensorflow_ends_the_run_at_once(tmp_path, procs):
    (tmp_path / "forever.py").write_text("import time\nwhile True:\n    time.sleep(1)\n")
    run = Run(procs, ["--tf1", "--ps", "0", "--workers", "2", "--log-dir", tmp_path / "logs", "--",
                      "python", "forever.py"], tmp_path)
    run.wait_for(r"TF1 fork server started", 60)
    os.kill(run.proc.pid, signal.SIGINT)
    assert run.finish(30) == 130, run.output
    assert "worker:0 started" not in run.output     # nothing was forked, nothing waited for the import to end


@pytest.mark.timeout(120)
def test_a_fork_server_that_died_is_named_with_how_it_ended_and_its_log(tmp_path):
    server = ForkServer(base_env(), str(tmp_path / "forkserver.log"))
    server.start()
    try:
        server.wait_ready(lambda: False)
        os.kill(server.pid, signal.SIGKILL)
        with pytest.raises(TfclusterError) as e:
            server.spawn([sys.executable, "-m", "tfcluster.tf1", "train.py"], base_env())
        assert str(e.value) == f"the TF1 fork server is gone (it was killed by SIGKILL); see its log: {server.log_path}"
    finally:
        server.stop()
