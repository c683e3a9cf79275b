"""A real Slurm for tests: munged, slurmctld and one slurmd per node, all under one private temp dir.

``Slurm(nodes)`` writes a ``slurm.conf`` of its own (free ports, its own munge
key and socket, ``proctrack/pgid`` and ``task/none`` so that no cgroup is
needed), starts the daemons and waits until ``sinfo`` says every node is idle.
A node is either this machine on loopback (``Node("localhost", "127.0.0.1")``)
or a network-namespace host of ``tests/netns.py`` (``Node("h0", addr, netns)``);
then the controller lives in a namespace host of its own, and client commands
(``srun``, ``sbatch``, ``sinfo``) run there through :meth:`Slurm.client`.

Inside a namespace host a daemon is started with ``nsenter --net`` (``ip netns
exec`` remounts /sys, and slurmd 22.05 then fails on cgroups) and in a mount
namespace of its own whose /etc/hosts names every node, so node names resolve
to their namespace addresses for the daemon and every task it starts, and the
machine's /etc/hosts is never touched.

:meth:`Slurm.close` cancels every job, stops the daemons it started (by process
group) and then kills, by PID, any process still carrying this instance's
``SLURM_CONF`` (slurmstepd and job tasks, which Slurm re-parents to init).
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

import psutil

from conftest import base_env, on_ci

#: Every program the fixture and the tests run.
PROGRAMS = ("munged", "munge", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "squeue", "scontrol", "scancel",
            "nsenter", "unshare", "mount")
#: What CI installs (scripts/ci-slurm-setup.sh), for the message when a program is missing.
PACKAGES = "slurmctld slurmd slurm-client munge"


#: Where to look for :data:`PROGRAMS` instead of PATH and the sbin dirs: a test hides Slurm with it.
SEARCH_PATH_ENV = "SLURM_TEST_SEARCH_PATH"


def missing_programs() -> list:
    """The programs of :data:`PROGRAMS` that are not on PATH (sbin included), or not on ``$SLURM_TEST_SEARCH_PATH``."""
    path = os.environ.get(SEARCH_PATH_ENV) or os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
    return [p for p in PROGRAMS if not shutil.which(p, path=path)]


def unavailable_reason() -> Optional[str]:
    """Why a real Slurm cannot run here, or None when it can."""
    missing = missing_programs()
    if missing:
        return f"Slurm is not installed (missing {', '.join(missing)}; apt-get install {PACKAGES})"
    if os.geteuid() != 0:
        return "a test Slurm runs slurmd, which launches tasks, as root"
    return None


def required() -> bool:
    """True where a missing Slurm is a failure, not a skip: on CI (``CI`` set), which installs it first.

    Anywhere else (a fresh container as root, a laptop) the README's test
    command must pass without Slurm, so the Slurm tests skip there, saying why.
    """
    return on_ci()


@dataclass(frozen=True)
class Node:
    """One slurmd: its node name, the address slurmctld reaches it at, its network namespace (None: this one)."""
    name: str
    address: str
    netns: Optional[str] = None


def _in_netns(netns: Optional[str], argv: list) -> list:
    return (["nsenter", f"--net=/var/run/netns/{netns}"] if netns else []) + argv


def consecutive_free_ports(count: int, tries: int = 50) -> int:
    """The first of ``count`` consecutive ports that are free on loopback right now."""
    import random

    from tfcluster.topology.ports import port_is_free
    for _ in range(tries):
        base = random.randint(20000, 60000 - count)
        if all(port_is_free(base + k) for k in range(count)):
            return base
    raise RuntimeError(f"found no {count} consecutive free ports in {tries} tries")


class Slurm:
    """A running test Slurm; use as a context manager (or call :meth:`start` and :meth:`close`)."""

    def __init__(self, nodes, controller_address: str = "127.0.0.1", controller_netns: Optional[str] = None,
                 cpus: int = 2, idle_timeout: float = 60.0):
        self.nodes = list(nodes)
        self.controller_address = controller_address
        self.controller_netns = controller_netns
        self.cpus = cpus
        self.idle_timeout = idle_timeout
        self.dir = None
        self.conf = None
        self._daemons = []   # (name, Popen), in start order

    # ------------------------------------------------------------ setup
    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self):
        """Write the config, start munged, slurmctld and the slurmds, and wait until every node is idle."""
        # munged wants every directory above its socket searchable by all, and
        # pytest's tmp dirs are 0700: hence a dir of our own under the temp root.
        self.dir = tempfile.mkdtemp(prefix="tfc-slurm-")
        os.chmod(self.dir, 0o755)
        for sub, mode in (("munge", 0o755), ("munge-key", 0o700), ("state", 0o700), ("log", 0o755),
                          ("spool", 0o755)):
            os.mkdir(self._path(sub), mode)
        for n in self.nodes:
            os.mkdir(self._path("spool", n.name))
        with open(self._path("munge-key", "key"), "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(self._path("munge-key", "key"), 0o400)
        self.conf = self._path("slurm.conf")
        with open(self.conf, "w", encoding="utf-8") as f:
            f.write(self._conf_text())
        with open(self._path("hosts"), "w", encoding="utf-8") as f:
            f.write("127.0.0.1 localhost\n" + "".join(f"{n.address} {n.name}\n" for n in self.nodes))
        self._daemon("munged", ["munged", "-F", f"--key-file={self._path('munge-key', 'key')}",
                                f"--socket={self.socket}", f"--pid-file={self._path('munge-key', 'pid')}",
                                f"--seed-file={self._path('munge-key', 'seed')}", "--num-threads=4"])
        self._wait(lambda: os.path.exists(self.socket), 15, "munged's socket " + self.socket, "munged")
        self._daemon("slurmctld", _in_netns(self.controller_netns, ["slurmctld", "-D", "-i"]))
        self._wait(self._controller_up, 30, "slurmctld to answer 'scontrol ping'", "slurmctld")
        for n in self.nodes:
            self._daemon(f"slurmd {n.name}", self._node_argv(n, ["slurmd", "-D", "-N", n.name]))
        self._wait(self._all_idle, self.idle_timeout, "every node to be idle in sinfo", "slurmd")

    def _path(self, *parts) -> str:
        return os.path.join(self.dir, *parts)

    @property
    def socket(self) -> str:
        """munged's socket, which every Slurm daemon and client of this instance uses."""
        return self._path("munge", "socket")

    def _conf_text(self) -> str:
        ctl_port, node_port = self._ports()
        lines = [
            "ClusterName=tfctest",
            # slurmctld accepts itself only under this machine's host name (a netns shares it).
            f"SlurmctldHost={socket.gethostname()}({self.controller_address})",
            f"SlurmctldPort={ctl_port}", f"SlurmdPort={node_port}",
            "AuthType=auth/munge", f"AuthInfo=socket={self.socket}", "CredType=cred/munge",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={self._path('state')}",
            f"SlurmctldPidFile={self._path('slurmctld.pid')}", f"SlurmctldLogFile={self._path('log', 'slurmctld.log')}",
            # %n: each slurmd gets its own spool, pid and log file.
            f"SlurmdSpoolDir={self._path('spool', '%n')}", f"SlurmdPidFile={self._path('spool', '%n.pid')}",
            f"SlurmdLogFile={self._path('log', 'slurmd-%n.log')}",
            # No cgroups here: process groups track a job's processes.
            "ProctrackType=proctrack/pgid", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "MpiDefault=none", "ReturnToService=2",
            # Several slurmds share one machine's CPUs and memory: the config, not the hardware, says what a node has.
            "SlurmdParameters=config_overrides",
            # A cancelled job's tasks get SIGTERM, then SIGKILL this long after (Slurm's default is 30 s).
            "KillWait=30",
        ]
        lines += [f"NodeName={n.name} NodeAddr={n.address} CPUs={self.cpus} State=UNKNOWN" for n in self.nodes]
        lines.append("PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _ports(self):
        from tfcluster.topology.ports import pick_free_ports
        # In namespace hosts every port is free; on loopback other processes share this machine's.
        return pick_free_ports(2)

    def _node_argv(self, node: Node, argv: list) -> list:
        if not node.netns:
            return argv
        # A private mount namespace whose /etc/hosts names every node: nothing global changes.
        script = 'mount --bind "$0" /etc/hosts && exec "$@"'
        return _in_netns(node.netns, ["unshare", "--mount", "--propagation", "private", "--",
                                      "sh", "-c", script, self._path("hosts"), *argv])

    def _daemon(self, name: str, argv: list):
        log = open(self._path("log", name.replace(" ", "-") + ".out"), "wb")
        try:
            p = subprocess.Popen(argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        finally:
            log.close()
        self._daemons.append((name, p))

    def _wait(self, ready, timeout: float, what: str, daemon: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [(n, p.returncode) for n, p in self._daemons if p.poll() is not None]
            if dead:
                raise RuntimeError(f"test Slurm: {dead[0][0]} exited with code {dead[0][1]} while waiting for "
                                   f"{what}:\n{self.logs(daemon)}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"test Slurm: timed out after {timeout:g}s waiting for {what}:\n{self.logs(daemon)}")

    def _controller_up(self) -> bool:
        r = self.run("scontrol", "ping", check=False, timeout=10)
        return r.returncode == 0 and "is UP" in r.stdout

    def node_states(self) -> dict:
        """``{node: state}`` as sinfo gives them (``idle``, ``alloc``, ``down*``, ...)."""
        r = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=10)
        return dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)

    def _all_idle(self) -> bool:
        states = self.node_states()
        return sorted(states) == sorted(n.name for n in self.nodes) and set(states.values()) == {"idle"}

    # ------------------------------------------------------------ use
    def env(self, **extra) -> dict:
        """The environment of a Slurm client or daemon of this instance."""
        return base_env(SLURM_CONF=self.conf, **extra)

    def client(self, *argv) -> list:
        """The argv that runs a client command (srun, sbatch, ...) where the controller is reachable."""
        return _in_netns(self.controller_netns, [str(a) for a in argv])

    def run(self, *argv, timeout: float = 30, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run a client command to completion (text output); ``check``: fail with its output on non-zero exit."""
        r = subprocess.run(self.client(*argv), env=kw.pop("env", None) or self.env(), capture_output=True, text=True,
                           timeout=timeout, **kw)
        if check and r.returncode:
            raise AssertionError(f"{' '.join(map(str, argv))} exited {r.returncode}:\n{r.stdout}{r.stderr}")
        return r

    def jobs(self) -> list:
        """The ids of every job this Slurm still has (pending, running or completing)."""
        r = self.run("squeue", "-h", "-o", "%A", check=False, timeout=10)
        return [line.strip() for line in r.stdout.splitlines() if line.strip()]

    def processes(self, job_id: Optional[str] = None) -> list:
        """Live processes started for this Slurm (a job's, with ``job_id``), its daemons not included."""
        daemons = {p.pid for _, p in self._daemons}
        found = []
        for proc in psutil.process_iter(["pid"]):
            if proc.pid in daemons or proc.pid == os.getpid():
                continue
            try:
                env = proc.environ()
                if env.get("SLURM_CONF") != self.conf or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if job_id is None or env.get("SLURM_JOB_ID") == str(job_id) or env.get("SLURM_JOBID") == str(job_id):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return found

    def logs(self, which: str = "", lines: int = 15) -> str:
        """The last lines of every daemon log whose file name contains ``which``."""
        out = []
        for name in sorted(os.listdir(self._path("log"))) if self.dir else []:
            if which in name:
                with open(self._path("log", name), errors="replace") as f:
                    tail = f.read().splitlines()[-lines:]
                out.append(f"--- {name}\n" + "\n".join(tail))
        return "\n".join(out)

    # ------------------------------------------------------------ teardown
    def close(self):
        """Cancel every job, stop every daemon started here, kill what is left of them; remove the temp dir."""
        if self.conf:
            # Jobs first, while the daemons can still record their end: their processes go by PID (a step
            # killed this way ends at once, where a cancel would wait KillWait), then every job, pending too.
            self._kill_job_processes()
            try:
                if any(n == "slurmctld" and p.poll() is None for n, p in self._daemons):
                    self._cancel_jobs()
            except (subprocess.TimeoutExpired, OSError):
                pass
        # slurmds first (they end their steps), the controller, munged last: each needs the next.
        for _, p in reversed(self._daemons):
            _stop_group(p)
        self._daemons = []
        if self.conf:
            # slurmstepd outlives slurmd (Slurm re-parents it to init): whatever still runs for us goes now.
            self._kill_job_processes()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _cancel_jobs(self, timeout: float = 15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids = self.jobs()
            if not ids:
                return
            self.run("scancel", *ids, check=False, timeout=10)
            self._kill_job_processes()
            time.sleep(0.5)

    def _kill_job_processes(self):
        for _ in range(3):   # a step may be starting while we kill: look again until none is left
            left = self.processes()
            if not left:
                return
            for proc in left:
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(left, timeout=5)


def _stop_group(p: subprocess.Popen, grace: float = 10.0):
    """SIGTERM a daemon's process group (its session: it was started in one of its own), SIGKILL after ``grace``."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=wait)
            # The group may outlive its leader (slurmctld's slurmscriptd): end the rest too.
            os.killpg(p.pid, signal.SIGKILL)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
