"""TF1-mode tasks forked from one preloaded process instead of each importing TensorFlow (the launcher's side).

``tfcluster local --tf1`` starts :mod:`tfcluster.tf1.forkserver` once; each
TF1-mode task (``python -m tfcluster.tf1 SCRIPT ...`` with this launcher's
Python) is then a fork of it, whose script starts without importing
TensorFlow again. A :class:`ForkedProcess` stands where a ``subprocess.Popen``
stands for other tasks (pid, output pipe, ``poll``): its pid leads its own
process group, is a real process the launcher signals as any other, and stays
unreaped by the server until the launcher has seen its exit, so the pid the
launcher signals is never another process's. This module imports no TensorFlow.
"""

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Optional

from ..core.errors import TfclusterError
from ..core.exits import describe_exit

log = logging.getLogger("tfcluster")

#: How long the server may take to import TensorFlow and the rest (seconds); a task's own import has no bound
#: either, but a server that never answers must not hang the run.
READY_TIMEOUT = 300.0
MESSAGE_BYTES = 1 << 20
#: How long a ready server may take to answer a fork request (seconds).
FORK_TIMEOUT = 30.0
#: Variables that describe one task, never the server that imports for all of them.
TASK_ONLY = ("TF_CONFIG", "CUDA_VISIBLE_DEVICES")


def _launchers_python(program: str, env) -> bool:
    """True when ``program`` found on the task's PATH is this launcher's Python (same interpreter and
    site-packages, so what the server imported is what the task would import)."""
    found = shutil.which(program, path=env.get("PATH"))
    if found is None or os.path.dirname(os.path.abspath(found)) != os.path.dirname(os.path.abspath(sys.executable)):
        return False
    try:
        return os.path.samefile(found, sys.executable)
    except OSError:
        return False


def forkable(argv, env) -> bool:
    """True for a TF1-mode task's command a fork of the server can run: TF1 mode and a script (not
    --session-fixes-only, whose TensorFlow is TF 2's) under this launcher's Python (``python`` found on the
    task's PATH in the launcher's own bin folder: the same interpreter and site-packages)."""
    argv = list(argv)
    if len(argv) < 4 or argv[1:3] != ["-m", "tfcluster.tf1"] or argv[3].startswith("-"):
        return False
    return _launchers_python(argv[0], env)


def hosted_server(argv, env) -> bool:
    """True for the command of a server tfcluster hosts (``python -m tfcluster start ...``, a ps of ``tfcluster
    local``) under this launcher's Python: forked beside TF1-mode tasks, it does not import TensorFlow again."""
    argv = list(argv)
    return argv[1:4] == ["-m", "tfcluster", "start"] and _launchers_python(argv[0], env)


class ForkServer:
    """The run's preloaded process: started once, it forks each TF1-mode task on request."""

    def __init__(self, env: dict, log_path: str, bind=None):
        self.env = {k: v for k, v in env.items() if k not in TASK_ONLY}
        self.log_path = log_path
        self._bind = bind                  # (argv, env) -> the argv that dies with the launcher
        self._sock: Optional[socket.socket] = None
        self._popen: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()
        self._ready = False
        self._exits = {}                   # pid -> returncode, seen but not yet taken by its ForkedProcess
        self._gone = False

    def start(self):
        """Start the server; it imports in the background while the launcher starts the other tasks."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(self.log_path, "ab") as out:
            argv = [sys.executable, "-m", "tfcluster.tf1.forkserver", str(theirs.fileno())]
            self._popen = subprocess.Popen(self._bind(argv, self.env) if self._bind else argv,
                                           env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                           stderr=subprocess.STDOUT, pass_fds=[theirs.fileno()],
                                           start_new_session=True)
        theirs.close()
        self._sock = mine

    @property
    def pid(self) -> Optional[int]:
        """The server's pid once started."""
        return self._popen.pid if self._popen is not None else None

    def _receive(self, timeout: Optional[float]):
        """One message from the server (None on timeout); marks the server gone on EOF."""
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(MESSAGE_BYTES)
        except (socket.timeout, BlockingIOError):
            return None
        except OSError:
            data = b""
        if not data:
            self._gone = True
            return None
        message = json.loads(data)
        if "exit" in message:
            self._exits[message["exit"]] = message["code"]
        return message

    def wait_ready(self, interrupted) -> bool:
        """Wait for the server's imports (bounded by READY_TIMEOUT); False when ``interrupted()`` turns true first."""
        deadline = time.monotonic() + READY_TIMEOUT
        with self._lock:
            while not self._ready:
                if interrupted():
                    return False
                left = deadline - time.monotonic()
                if self._gone:
                    raise TfclusterError(f"the TF1 fork server ended before it was ready; see its log: "
                                         f"{self.log_path}")
                if left <= 0:
                    raise TfclusterError(f"the TF1 fork server did not import TensorFlow within "
                                         f"{READY_TIMEOUT:g}s; see its log: {self.log_path}")
                message = self._receive(min(left, 0.2))
                if message is not None and "error" in message:
                    self._gone = True
                    raise TfclusterError(f"the TF1 fork server cannot import TF1 mode: {message['error']}")
                self._ready = bool(message and message.get("ready"))
        return True

    def spawn(self, argv, env: dict, cgroup: Optional[str] = None, cwd: Optional[str] = None,
              stderr: bool = False) -> "ForkedProcess":
        """Fork the task ``argv`` (:func:`forkable`, or :func:`hosted_server`'s) in ``env`` and ``cwd`` (default:
        ours), once the server is ready; its output on a new pipe (``stderr``: its errors on a second one)."""
        self.wait_ready(lambda: False)
        with self._lock:
            pipes = [os.pipe() for _ in range(2 if stderr else 1)]
            argv = list(argv)
            request = {"module": argv[2], "argv": argv[3:], "env": dict(env), "cwd": cwd or os.getcwd(),
                       "cgroup": cgroup}
            try:
                socket.send_fds(self._sock, [json.dumps({"spawn": request}).encode()], [w for _, w in pipes])
            except OSError as e:
                for r, _ in pipes:
                    os.close(r)
                raise self._gone_error(e.strerror) from None
            finally:
                for _, w in pipes:
                    os.close(w)
            while True:
                message = self._receive(FORK_TIMEOUT)
                if message is not None and "pid" in message:
                    return ForkedProcess(self, message["pid"], *(os.fdopen(r, "rb", buffering=0) for r, _ in pipes))
                if self._gone or message is None:
                    for r, _ in pipes:
                        os.close(r)
                    if self._gone:
                        raise self._gone_error("it closed its end")
                    raise TfclusterError(f"the TF1 fork server did not fork the task within {FORK_TIMEOUT:g}s; "
                                         f"see its log: {self.log_path}")

    def _gone_error(self, otherwise: str) -> TfclusterError:
        """The one line for a server found gone: how it ended (``it was killed by SIGKILL``) once it has, else
        ``otherwise``, and its log."""
        try:
            how = "it " + describe_exit(self._popen.wait(1.0))
        except (subprocess.TimeoutExpired, AttributeError):
            how = otherwise
        return TfclusterError(f"the TF1 fork server is gone ({how}); see its log: {self.log_path}")

    def returncode(self, pid: int) -> Optional[int]:
        """``pid``'s returncode once the server said it ended (then reaped), else None."""
        with self._lock:
            while pid not in self._exits and not self._gone:
                if self._receive(0.0) is None:
                    break
            if pid in self._exits:
                code = self._exits.pop(pid)
                try:
                    self._sock.send(json.dumps({"reap": pid}).encode())
                except OSError:
                    pass
                return code
            if self._gone:
                # The server died, and its tasks with it (PR_SET_PDEATHSIG): as killed.
                return -9
            return None

    def stop(self):
        """Close the server's socket: it kills what is left of its tasks and exits (at once while it imports)."""
        if self._sock is not None:
            self._sock.close()
        if self._popen is not None:
            if not self._ready:
                self._popen.kill()
            try:
                self._popen.wait(10.0)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()


class ForkedProcess:
    """A task forked by the server, as a Popen: ``pid`` (its group), ``stdout`` (its output; ``stderr`` when
    spawned with its own), ``poll()``."""

    def __init__(self, server: ForkServer, pid: int, stdout, stderr=None):
        self.server, self.pid, self.stdout, self.stderr = server, pid, stdout, stderr
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        """The returncode once the task has ended (-S for death by signal S), else None."""
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid)
        return self.returncode
