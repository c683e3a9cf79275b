"""Machines, not just ports: tasks on separate network hosts (namespaces) with real links."""

import json
import sys
import time

import pytest

from conftest import TFCLUSTER, base_env, no_process_left, wait_until
from netns import Hosts, unavailable_reason

_why = unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.slow,
              pytest.mark.skipif(_why is not None, reason=f"no test hosts: {_why}")]

WORKER_SCRIPT = """
import tensorflow as tf, tfcluster
tf1 = tf.compat.v1; tf1.disable_eager_execution()
cluster, server = tfcluster.server_from_tf_config(timeout=60)
with tf1.device("/job:ps/task:0"):
    v = tf1.get_variable("v", initializer=20.0)
with tf1.device(cluster.task.device):
    y = v + 1.0
with tf1.Session(server.target, config=cluster.session_config()) as s:
    s.run(v.initializer)
    print("value", s.run(y), flush=True)
"""


@pytest.fixture(scope="module")
def hosts():
    with Hosts(2) as h:
        yield h


@pytest.fixture
def spec(hosts, tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"ps": [f"{hosts.addresses[0]}:2222"], "worker": [f"{hosts.addresses[1]}:2222"]}))
    return path


@pytest.mark.timeout(120)
def test_a_worker_on_one_host_uses_a_variable_on_a_ps_on_another(hosts, spec, procs, tmp_path):
    # Each namespace has its own port space, so both tasks can use port 2222.
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    ps = procs.start(hosts.exec_prefix(0) + TFCLUSTER + ["start", "--cluster", spec, "--job", "ps", "--task", "0"])
    worker = procs.start(hosts.exec_prefix(1) + TFCLUSTER + ["start", "--cluster", spec, "--job", "worker",
                                                             "--task", "0", "--", sys.executable, script])
    out, _ = worker.communicate(timeout=90)
    assert worker.returncode == 0, out
    assert "value 21.0" in out
    # The worker's clean exit tells the ps, across the link, that it may go.
    assert ps.wait(timeout=30) == 0
    assert no_process_left([ps.pid, worker.pid])


@pytest.mark.timeout(120)
def test_status_sees_a_task_go_down_when_its_link_is_cut_and_up_when_mended(hosts, spec, procs):
    ps = procs.start(hosts.exec_prefix(0) + TFCLUSTER + ["start", "--cluster", spec, "--job", "ps", "--task", "0"])
    status = hosts.exec_prefix(1) + TFCLUSTER + ["status", "--cluster", str(spec), "--timeout", "1"]

    def ps_state():
        import subprocess
        r = subprocess.run(status, capture_output=True, text=True, timeout=30, env=base_env())
        return [line.split()[-1] for line in r.stdout.splitlines() if line.startswith("ps")][0]

    wait_until(lambda: ps_state() == "up", 60, "the ps to answer across the link")
    hosts.cut(0)
    try:
        assert ps_state() == "down"
    finally:
        hosts.mend(0)
    wait_until(lambda: ps_state() == "up", 30, "the ps to answer again once the link is back")
    ps.terminate()
    assert ps.wait(timeout=15) == 0


@pytest.mark.timeout(120)
def test_a_worker_whose_ps_is_cut_off_gives_up_in_time_naming_it(hosts, spec, procs, tmp_path):
    # No ps runs at all on host 0: the worker must fail inside its timeout.
    script = tmp_path / "wait.py"
    script.write_text("import tfcluster\ntfcluster.server_from_tf_config(timeout=4)\n")
    start = time.monotonic()
    worker = procs.start(hosts.exec_prefix(1) + TFCLUSTER + ["start", "--cluster", spec, "--job", "worker",
                                                             "--task", "0", "--", sys.executable, script])
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode != 0
    assert f"/job:ps/task:0 at {hosts.addresses[0]}:2222" in out
    assert time.monotonic() - start < 40
