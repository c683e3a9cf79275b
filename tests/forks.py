"""One-process TF1-mode programs, forked as ``tfcluster local --tf1`` forks its tasks: :func:`run`.

A ``python -m tfcluster.tf1 SCRIPT`` process spends ~8 s of CPU importing
TensorFlow, tf-keras and the Estimator before the script's first line: in
three quarters of one run of the suite, 55 such processes took 9.3 s of CPU
each (mostly those imports), some four minutes of a two-core run. Each test
worker therefore starts the launcher's own fork server (tfcluster/launch/forked.py) once, and
forks those programs from it: each runs TF1 mode's own ``main`` in its own
environment, directory and pipes, as a task of ``tfcluster local --tf1`` does
(docs/tf1.md, "How the tasks start"). A program whose environment differs
from the server's in what the imports read starts as typed, as does
tests/test_tf1.py's probe of what a script sees; tests/test_forked.py compares
the two ways on a cluster; ``TFCLUSTER_NO_FORK=1`` starts every program as typed.
"""

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tfcluster.launch.forked import ForkServer, forkable
from tfcluster.launch.processes import bound_command

_SERVER = None


def _server(env) -> ForkServer:
    """This worker's fork server, started with the first program's environment (what it imports with)."""
    global _SERVER
    if _SERVER is None:
        fd, log_path = tempfile.mkstemp(prefix="tfcluster-test-forkserver-", suffix=".log")
        os.close(fd)
        # As the launcher's own: the server dies with this test worker, even by SIGKILL.
        _SERVER = ForkServer(env, log_path, bind=bound_command)
        _SERVER.start()
        atexit.register(_SERVER.stop)
    return _SERVER


def _text(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` decodes: universal newlines."""
    return data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


#: What may differ between a forked program's environment and the server's: what TensorFlow and tfcluster read
#: after the imports. Any other difference (TF_USE_LEGACY_KERAS=0, say) is one the imports would see: started.
READ_AFTER_IMPORT = ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", "PYTEST_CURRENT_TEST")


def _imports_alike(env, server) -> bool:
    differ = {k for k in set(env) | set(server.env) if env.get(k) != server.env.get(k)}
    return all(k in READ_AFTER_IMPORT or k.startswith("TFCLUSTER_") for k in differ)


def run(argv, env, cwd=None, timeout=None) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)``; a TF1-mode
    program (:func:`tfcluster.launch.forked.forkable`) is forked from this worker's fork server."""
    argv = [str(a) for a in argv]
    if os.environ.get("TFCLUSTER_NO_FORK") or not forkable(argv, env) or not _imports_alike(env, _server(env)):
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    server = _server(env)
    child = server.spawn(argv, env, cwd=str(cwd) if cwd else None, stderr=True)
    out, err = [], []
    readers = [threading.Thread(target=lambda f=f, into=into: into.append(f.read()), daemon=True)
               for f, into in ((child.stdout, out), (child.stderr, err))]
    deadline = None if timeout is None else time.monotonic() + timeout
    finished = False
    try:
        for t in readers:
            t.start()
        for t in readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        while child.poll() is None and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.01)
        finished = child.returncode is not None
    finally:
        if not finished:            # the timeout, or the test's own (pytest-timeout) interrupting us
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            while child.poll() is None:
                time.sleep(0.01)
        for f in (child.stdout, child.stderr):
            f.close()
    stdout, stderr = _text(b"".join(out)), _text(b"".join(err))
    if not finished:
        raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
    return subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)


#: ``python -m tfcluster.tf1``: the command :func:`run` forks.
TF1 = [sys.executable, "-m", "tfcluster.tf1"]
