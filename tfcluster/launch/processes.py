"""The tasks' processes: starting one, reading its output, and making sure none outlives the run.

Each task runs in its own process group (so a signal reaches its whole tree)
with its output piped through the launcher, which prefixes every line with
the task's name and keeps one log file per task. A task dies with the
launcher even when the launcher is SIGKILLed (Linux's PR_SET_PDEATHSIG), and
:class:`TaskGroup` stops what is left at the end: each group, every
descendant it ever saw, and the orphans it adopted as a subreaper. Only
processes the launcher started are ever signalled, by pid or process group.
"""

import collections
import errno
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

from ..core import environment, posix
from ..core.errors import TfclusterError
from ..core.private import open_private
from ..topology.cluster import Task
from ..topology.taskenv import set_huge_pages
from .forked import ForkServer, forkable as is_forkable, hosted_server as is_hosted_server

log = logging.getLogger("tfcluster")

#: Seconds between SIGTERM and SIGKILL when the launcher stops a task.
TERM_GRACE = 1.0
_PR_SET_CHILD_SUBREAPER = 36
#: Where a piece of a task's output ends: a line break, or a carriage return (a progress bar's redraw).
_PIECE_END = re.compile(rb"\r\n|\r|\n")


#: The program that binds a task to the launcher before it execs the task's command (see its doc).
EXEC_BOUND = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exec_bound.py")


def _executable(program: str, env) -> str:
    """``program`` as exec would find it on ``env``'s PATH; OSError as exec would raise it."""
    path = program if os.sep in program else shutil.which(program, path=os.pathsep.join(os.get_exec_path(env)))
    if path is None or not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    return path


def bound_command(argv, env, cgroup_procs: Optional[str] = None) -> list:
    """``argv`` started through :data:`EXEC_BOUND`: it dies with this launcher, even by SIGKILL (Linux's
    prctl), after joining the memory cgroup whose ``cgroup.procs`` is ``cgroup_procs``; ``argv`` as it is where
    there is neither. OSError when ``argv[0]`` cannot be run.

    No Python runs between fork and exec in the launcher (no ``preexec_fn``; exec_bound.py says why). Only the
    task's own process gets the death signal; its descendants are the launcher's to stop while it lives.
    """
    argv = list(argv)
    executable = _executable(argv[0], env)
    if posix.prctl() is None and cgroup_procs is None:
        return argv
    return [sys.executable, "-I", "-S", EXEC_BOUND, str(os.getpid()), cgroup_procs or "", executable] + argv


def start_tasks(procs, writer, interrupted):
    """Start ``procs`` in order, each announced with its pid; stop starting when ``interrupted()`` turns true while
    a TF1-mode task waits for the fork server's import (the supervisor then ends the run, saying why)."""
    for p in procs:
        if not p.start(writer, interrupted):
            return
        log.info("%s started (pid %d): %s", p.name, p.popen.pid, " ".join(shlex.quote(a) for a in p.argv))


#: The fork server's own log, beside the tasks' in the run's log dir.
FORK_SERVER_LOG = "tf1-forkserver.log"


def fork_tf1_tasks(procs, log_dir: str):
    """Start one :class:`~.forked.ForkServer` for the TF1-mode tasks among ``procs`` and have them forked from it,
    with the hosted ps tasks; returns it (None when no task's command is TF1 mode's). Started before any task."""
    forkable = [p for p in procs if is_forkable(p.argv, p.env)]
    if not forkable:
        return None
    hosted = [p for p in procs if is_hosted_server(p.argv, p.env)]
    # The server's environment is what every forked TF1-mode task's has in common (each gets its own at the fork).
    common = {k: v for k, v in forkable[0].env.items() if all(p.env.get(k) == v for p in forkable[1:])}
    if hosted:
        # A ps asks glibc for huge pages (topology/taskenv.py), which reads its tunables when a process starts:
        # a forked ps has the server's, and so have the forked trainers.
        set_huge_pages(common)
    server = ForkServer(common, os.path.join(log_dir, FORK_SERVER_LOG),
                        bind=bound_command)
    server.start()
    log.info("TF1 fork server started (pid %d): %s are forked from it once it has imported TensorFlow "
             "(--no-fork: each imports its own)", server.pid, ", ".join(p.name for p in procs
                                                                         if p in hosted or p in forkable))
    for p in hosted + forkable:
        p.forks = server
    return server


class TaskProcess:
    """One task of the local cluster: its command, its process, its log, its port."""

    def __init__(self, task: Task, argv, env, log_path, port=None, placeholder=None):
        self.task = task
        self.name = str(task)
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.port = port
        self.placeholder = placeholder      # holds our port (release()) until our server is up
        self.popen: Optional[subprocess.Popen] = None
        self.reader: Optional[threading.Thread] = None
        self.restarts = 0
        self.grace = TERM_GRACE             # SIGTERM -> SIGKILL for this task's group
        self.started_at = 0.0
        self.returncode: Optional[int] = None
        self.known = {}                     # pid -> psutil.Process: every descendant ever seen
        self.tail = collections.deque(maxlen=40)   # the last lines of the current run, for failure_cause
        self._log_lock = threading.Lock()
        self.log_file = open_private(log_path, "wb")
        self.cgroup = None                  # a memory.Cgroup the process joins before it execs (--ps-memory)
        self.forks = None                   # the run's ForkServer when this TF1-mode task is forked from it

    @property
    def is_trainer(self) -> bool:
        """True for the tasks whose exit ends the run (:attr:`Task.ends_the_run`)."""
        return self.task.ends_the_run

    @property
    def running(self) -> bool:
        """True from the start until the exit is seen."""
        return self.popen is not None and self.returncode is None

    def start(self, writer, interrupted=None) -> bool:
        """Start (or restart) the task's process; its lines go to ``writer`` (a LineWriter) and the log. False
        when ``interrupted()`` turned true while it waited for the fork server (nothing started)."""
        env = dict(self.env, **{environment.RESTART_COUNT.name: str(self.restarts)})
        if self.forks is not None:
            if not self.forks.wait_ready(interrupted or (lambda: False)):
                return False
            self.popen = self.forks.spawn(self.argv, env, self.cgroup.path if self.cgroup is not None else None)
            self._started(writer)
            return True
        try:
            # The death signal follows the thread that forks: start() always runs
            # on the launcher's supervising thread, which outlives every task.
            # The cgroup first: everything the task allocates, from its first page, is charged to its limit.
            command = bound_command(self.argv, env, self.cgroup.procs if self.cgroup is not None else None)
            self.popen = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        except OSError as e:
            raise TfclusterError(f"cannot start {self.name} ({self.argv[0]!r}): {e.strerror}") from None
        self._started(writer)
        return True

    def _started(self, writer):
        self.returncode = None
        self.started_at = time.monotonic()
        self.tail.clear()
        self.reader = threading.Thread(target=self._pump, args=(self.popen.stdout, writer),
                                       name=f"tfcluster-log-{self.name}", daemon=True)
        self.reader.start()

    def _pump(self, pipe, writer):
        """Copy the task's output to its log file byte for byte, and show it piece by piece, prefixed.

        A piece ends at ``\n``, ``\r\n`` or a lone ``\r``: a progress bar that
        redraws itself with ``\r`` is shown as each redraw arrives, one line each.
        """
        fd = pipe.fileno()
        pending, after_cr = b"", False
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                with self._log_lock:
                    if not self.log_file.closed:
                        self.log_file.write(chunk)
                        self.log_file.flush()
                pending += chunk
                start = 0
                for m in _PIECE_END.finditer(pending):
                    piece, start = pending[start:m.start()], m.end()
                    if after_cr and m.start() == 0 and m.group() == b"\n":
                        pass            # the \n of a \r\n that arrived in two reads
                    elif piece or m.group() == b"\n":
                        self._show(writer, piece)
                    after_cr = m.group() == b"\r" and m.end() == len(pending)
                pending = pending[start:]
            if pending:
                self._show(writer, pending)
        except (OSError, ValueError):
            pass
        finally:
            pipe.close()

    def _show(self, writer, piece: bytes):
        text = piece.decode("utf-8", "replace")
        self.tail.append(text)
        writer.line(f"[{self.name}] {text}")

    def poll(self) -> Optional[int]:
        """The return code once the process has exited (it is reaped here, once)."""
        if self.popen is not None and self.returncode is None:
            self.returncode = self.popen.poll()
        return self.returncode

    def remember_descendants(self):
        """Note every descendant now alive, so none escapes when its parent dies first."""
        if not self.running:
            return
        try:
            import psutil
            for p in psutil.Process(self.popen.pid).children(recursive=True):
                self.known.setdefault(p.pid, p)
        except Exception:  # the process ended while we looked
            pass

    def signal_group(self, sig):
        """Send ``sig`` to this task's process group while its leader is unreaped (its pid is ours)."""
        if self.running:
            try:
                os.killpg(self.popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def drain(self, timeout: float):
        """Wait (bounded) for the last lines of the exited process to be shown."""
        if self.reader is not None:
            self.reader.join(timeout)

    def release_port(self):
        """Drop the placeholder that holds this task's port."""
        if self.placeholder is not None:
            self.placeholder.release()
            self.placeholder = None

    def close(self):
        """Drop the port and close the log file."""
        self.release_port()
        with self._log_lock:
            self.log_file.close()


def alive(p, own_pids) -> bool:
    """True while psutil process ``p`` runs; reaps it when it is an adopted zombie of ours."""
    import psutil
    try:
        if not p.is_running():
            return False
        if p.status() == psutil.STATUS_ZOMBIE:
            if p.pid not in own_pids and p.ppid() == os.getpid():
                try:
                    os.waitpid(p.pid, os.WNOHANG)
                except ChildProcessError:
                    pass
            return False
        return True
    except psutil.NoSuchProcess:
        return False


class TaskGroup:
    """Every process of a run's tasks: what stops them, whatever they left behind."""

    def __init__(self, procs, subreaper: bool = False, signals=()):
        self.procs = procs
        self.subreaper = subreaper
        self.signals = signals      # the launcher's received signals: a second one means no more waiting
        self.forks = None           # the TF1-mode tasks' ForkServer (fork_tf1_tasks), stopped after every task
        self.before = ()            # this process's children from before the run (become_subreaper): never ours

    def own_pids(self) -> set:
        """The pids of the tasks' own processes (leaders of their groups), and of the fork server they came from
        (not a leftover to stop: it stops with the group, after its tasks)."""
        server = {self.forks.pid} if self.forks is not None and self.forks.pid is not None else set()
        return {p.popen.pid for p in self.procs if p.popen is not None} | server

    def stop_leftovers(self, p: TaskProcess):
        """Kill what an exited task left behind (its group and every descendant we saw)."""
        own = self.own_pids()
        for q in list(p.known.values()):
            if alive(q, own):
                try:
                    q.kill()
                except Exception:
                    pass
        p.known.clear()

    def stop(self, procs=None):
        """SIGTERM every process of these tasks (all: and the adopted orphans), SIGKILL survivors after each
        task's grace."""
        import psutil
        everything = procs is None
        procs = self.procs if everything else procs
        own = self.own_pids()
        for p in procs:
            p.remember_descendants()
        extra = self.adopted(own) if self.subreaper and everything else []
        others = [q for p in procs for q in p.known.values()] + extra
        leaders = [p for p in procs if p.running]
        for p in leaders:
            p.signal_group(signal.SIGTERM)
        for q in others:
            if alive(q, own):
                try:
                    q.terminate()
                except psutil.Error:
                    pass

        def pending():
            return [p for p in leaders if p.poll() is None] + [q for q in others if alive(q, own)]
        start = time.monotonic()
        killed = set()
        end = start + max([p.grace for p in leaders] + [TERM_GRACE if others else 0.0])
        while pending() and time.monotonic() < end and len(self.signals) < 2:
            for p in leaders:
                if p.name not in killed and p.poll() is None and time.monotonic() >= start + p.grace:
                    log.debug("SIGKILL to %s, still alive %gs after SIGTERM", p.name, p.grace)
                    p.signal_group(signal.SIGKILL)
                    killed.add(p.name)
            time.sleep(0.02)
        left = pending()
        if left:
            log.debug("SIGKILL to %d process(es) still alive after SIGTERM", len(left))
        for p in leaders:
            if p.poll() is None:
                p.signal_group(signal.SIGKILL)
        for q in others:
            if alive(q, own):
                try:
                    q.kill()
                except psutil.Error:
                    pass
        end = time.monotonic() + 5.0
        while pending() and time.monotonic() < end:
            time.sleep(0.02)
        for p in procs:
            p.known = {pid: q for pid, q in p.known.items() if alive(q, own)}
        if everything and self.forks is not None:
            self.forks.stop()

    def adopted(self, own) -> list:
        """This process's descendants that are not the tasks themselves (``own``): the tasks' descendants and the
        orphans adopted as a subreaper, never the subtree of a child it had before the run."""
        import psutil
        found = []
        try:
            children = psutil.Process().children()
        except psutil.Error:
            return found
        for child in children:
            if child in self.before:
                continue
            try:
                found += [q for q in [child] + child.children(recursive=True) if q.pid not in own]
            except psutil.Error:        # it ended while we looked
                pass
        return found

    def become_subreaper(self):
        """Adopt the tasks' orphans (Linux's PR_SET_CHILD_SUBREAPER), where the system allows it."""
        # Orphans of our tasks (a daemonised grandchild) are then reparented to
        # us rather than init, so the final sweep finds and stops them too.
        import psutil
        try:
            # A program that runs the launcher in-process may have children of its own (the test suite's fork
            # server did, and a run's final sweep killed it): they and theirs are never swept.
            self.before = set(psutil.Process().children())
        except psutil.Error:
            pass
        prctl = posix.prctl()
        if prctl is None:
            return      # posix.missing_features() said so in the launcher's first lines
        if prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            import ctypes
            log.debug("prctl(PR_SET_CHILD_SUBREAPER) failed: %s", os.strerror(ctypes.get_errno()))

    def sweep_adopted(self, stop: bool = True):
        """Reap adopted zombies, and at the end stop every adopted orphan still running and adopt no more."""
        if not self.subreaper:
            return
        import psutil
        own = self.own_pids()
        living = [q for q in self.adopted(own) if alive(q, own)]
        if stop and living:
            log.debug("stopping %d orphaned process(es)", len(living))
            for q in living:
                try:
                    q.kill()
                except psutil.Error:
                    pass
            end = time.monotonic() + 5.0
            while any(alive(q, own) for q in living) and time.monotonic() < end:
                time.sleep(0.02)
        prctl = posix.prctl()
        if stop and prctl is not None:
            # Later orphans are init's again, as before the run: the launcher may have been a library call.
            prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
