"""A local cluster that nobody else can reach: ``tfcluster local`` in its own network namespace.

TensorFlow's server listens on every interface and runs any graph it is sent,
with no authentication (pitfalls item 7). ``tfcluster local`` therefore runs
the whole cluster in a network namespace of its own with only loopback, where
the system allows it, and says so in one line; ``--no-isolate`` turns that off.

Each test runs a real cluster: a ps hosted by ``tfcluster start`` (a real
TensorFlow server) and a worker that checks, from inside, that the ps answers.
While it runs, the test probes the ps's port from outside the cluster's
namespace: from this test's own namespace, and from another (namespaced)
host. ``--no-isolate`` runs are the control: the same probe then reaches it.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import TFCLUSTER, Procs, base_env, no_process_left
from jobs.stream import Stream
from netns import Hosts, unavailable_reason
from tfcluster import Cluster, Task, probe

INSIDE = """
import os, sys, time
import tfcluster
cluster = tfcluster.Cluster.from_tf_config()
tfcluster.wait_for_cluster(cluster, timeout=90)
# (/sys/class/net shows the namespace sysfs was mounted in; netlink shows ours)
import socket
print("inside: ps:0 answers; interfaces:", " ".join(sorted(n for _, n in socket.if_nameindex())), flush=True)
deadline = time.monotonic() + 90
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.1)
"""
OFF = "[tfcluster] isolation: off (--no-isolate): every task's server listens on all interfaces"


class LocalCluster:
    """``tfcluster local --ps 1 --workers 1`` of INSIDE, held open until :meth:`release`."""

    def __init__(self, procs, tmp_path, *options, prefix=()):
        (tmp_path / "inside.py").write_text(INSIDE)
        self.release_file = tmp_path / "release"
        self.logs = tmp_path / "logs"
        cmd = list(prefix) + TFCLUSTER + ["local", *options, "--ps", "1", "--workers", "1", "--timeout", "150",
                                          "--log-dir", str(self.logs), "--", sys.executable,
                                          str(tmp_path / "inside.py"), str(self.release_file)]
        self.run = Stream(procs.start(cmd, cwd=str(tmp_path)), "tfcluster local")
        _, m = self.run.wait_for(r"^\[tfcluster\] isolation: (\S+)", 30)
        if m.group(1) == "off" and "--no-isolate" not in options:
            self.finish()
            pytest.skip(f"isolation is not possible here: {self.run.text.splitlines()[0]}")
        _, m = self.run.wait_for(r"^\[worker:0\] inside: ps:0 answers; interfaces: (.*)$", 120)
        self.interfaces = m.group(1).split()
        self.cluster = Cluster.from_file(str(self.logs / "cluster.json"))
        self.ps_port = int(self.cluster.address(Task("ps", 0)).rsplit(":", 1)[1])

    def finish(self):
        self.release_file.write_text("")
        code = self.run.finish(timeout=60)
        pids = [int(m.group(1)) for _, m in self.run.matches(r"started \(pid (\d+)\)")]
        assert no_process_left(pids, timeout=10)
        return code


def refused(port, host="127.0.0.1"):
    """True when a TCP connection to host:port is refused (nothing listens there, for us)."""
    import socket
    try:
        with socket.create_connection((host, port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_isolated_cluster_works_inside_and_its_ports_are_closed_from_outside_its_namespace(procs, tmp_path):
    c = LocalCluster(procs, tmp_path)
    try:
        # Inside: the worker reached its ps, and loopback is all there is.
        assert c.interfaces == ["lo"]
        # Outside (this test's namespace, the machine's own): nothing answers on the ps's port.
        assert probe(c.cluster, [Task("ps", 0)], timeout=2.0) == {Task("ps", 0): "down"}
        assert refused(c.ps_port)
    finally:
        code = c.finish()
    assert code == 0, c.run.tail()
    assert c.run.matches(r"^\[tfcluster\] isolation: on: .*no other host can reach its ports, and its tasks "
                         r"cannot reach the network \(--no-isolate to turn off\)$")
    assert len(c.run.matches(r"isolation:")) == 1


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_with_no_isolate_the_same_cluster_answers_from_outside(procs, tmp_path):
    c = LocalCluster(procs, tmp_path, "--no-isolate")
    try:
        assert "lo" in c.interfaces and len(c.interfaces) > 1
        assert probe(c.cluster, [Task("ps", 0)], timeout=5.0) == {Task("ps", 0): "up"}
    finally:
        code = c.finish()
    assert code == 0, c.run.tail()
    assert c.run.matches(r"^" + re.escape(OFF))


def test_without_the_right_to_make_a_network_namespace_isolation_takes_a_user_namespace(procs, tmp_path):
    # As root without CAP_SYS_ADMIN, unshare(CLONE_NEWNET) is refused, as for any unprivileged user;
    # the launcher then makes a user namespace of its own (where the system allows it) and keeps its uid.
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to drop CAP_SYS_ADMIN")
    script = tmp_path / "listen.py"
    script.write_text("import os, json, socket\n"
                      "c = json.loads(os.environ['TF_CONFIG'])\n"
                      "port = int(c['cluster']['worker'][0].rsplit(':', 1)[1])\n"
                      "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
                      "s.bind(('', port)); s.listen()\n"
                      "print('uid', os.getuid(), 'listening', port, 'interfaces',"
                      " ' '.join(sorted(n for _, n in socket.if_nameindex())), flush=True)\n"
                      "print('inside', socket.create_connection(('localhost', port), timeout=2) is not None, "
                      "flush=True)\n"
                      "import time; time.sleep(float(os.environ.get('HOLD', '3')))\n")
    cmd = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"] + TFCLUSTER + [
        "local", "--ps", "0", "--workers", "1", "--log-dir", str(tmp_path / "logs"), "--", sys.executable, script]
    run = Stream(procs.start(cmd, cwd=str(tmp_path), env=base_env(HOLD="2")), "tfcluster local")
    _, m = run.wait_for(r"^\[worker:0\] uid (\d+) listening (\d+) interfaces (.*)$", 60)
    assert (int(m.group(1)), m.group(3)) == (0, "lo")
    run.wait_for(r"^\[worker:0\] inside True$", 10)
    assert refused(int(m.group(2)))
    assert run.finish(timeout=60) == 0, run.tail()
    assert run.matches(r"^\[tfcluster\] isolation: on: ")


# --------------------------------------------------- from another host, for real
@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.skipif(unavailable_reason() is not None, reason=f"no test hosts: {unavailable_reason()}")
def test_from_another_host_an_isolated_cluster_is_unreachable_and_a_non_isolated_one_answers(tmp_path):
    states = {}
    with Hosts(2) as hosts:
        for options in ((), ("--no-isolate",)):
            procs = Procs()
            work = tmp_path / (options[0].strip("-") if options else "isolated")
            work.mkdir()
            try:
                c = LocalCluster(procs, work, *options, prefix=hosts.exec_prefix(0))
                # Host 1 probes the ps's port at host 0's address, as any machine on its network could.
                address = f"{hosts.addresses[0]}:{c.ps_port}"
                r = subprocess.run(hosts.exec_prefix(1) + TFCLUSTER + ["status", "--ps", address, "--worker",
                                   f"{hosts.addresses[0]}:1", "--timeout", "3"], capture_output=True, text=True,
                                   timeout=60, env=base_env())
                row = next(line.split() for line in r.stdout.splitlines() if line.startswith("ps"))
                states[options[0] if options else "isolated"] = row[-1]
                assert c.finish() == 0, c.run.tail()
            finally:
                procs.cleanup()
    print(f"\nps:0 seen from another host: {states}")
    assert states == {"isolated": "down", "--no-isolate": "up"}
