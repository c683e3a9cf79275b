"""``python -m tfcluster.tf1.forkserver FD``: TF1 mode's tasks, forked from one process that imported TensorFlow.

A TF1-mode task spends ~8 s of CPU importing TensorFlow, tf-keras and the
Estimator before its script's first line (docs/map.md). ``tfcluster local
--tf1`` starts this server once per run; it imports all of that once and
forks each TF1-mode task from itself, so a task's script starts within a
fraction of a second and a 2-core laptop does not import TensorFlow once per
task (the launcher's side: :mod:`tfcluster.launch.forked`).

Nothing TF1 mode changes is done here: a forked task runs
``python -m tfcluster.tf1``'s own ``main`` in its own environment, so its
patches are its own; the run's hosted ps is forked too, and runs ``python -m
tfcluster start`` as it would on its own (it serves, and builds no model).
Only the imports are shared: TensorFlow reads no task-specific variable at
import (TF_CONFIG, CUDA_VISIBLE_DEVICES and the thread counts are read when the
task builds its server, session or devices), and no TensorFlow runtime
(devices, threads, gRPC) exists before the fork.

The launcher talks over one ``SOCK_SEQPACKET`` socket (inherited as ``FD``),
one JSON message each way per event:

- the server says ``{"ready": true}`` once the imports are done (or
  ``{"error": ...}`` and exits 2);
- ``{"spawn": {"module": M, "argv": [...], "env": {...}, "cwd": ..., "cgroup": ...}}``
  (the task's ``python -m M ARGV``: TF1 mode's ``tfcluster.tf1``, or ``tfcluster`` for the hosted ps), with
  the task's output pipe attached (SCM_RIGHTS; or two: its stdout's, its stderr's), is answered with
  ``{"pid": N}``; the task is a session leader (its pid is its group), dies
  with the server (PR_SET_PDEATHSIG), and its output and errors go to the pipe;
- ``{"exit": N, "code": C}`` when task N ends (C as Popen's returncode: -S
  for death by signal S); the task stays unreaped, so its pid cannot be
  reused, until the launcher says ``{"reap": N}``.

When the launcher closes the socket (or dies), the server kills what is left
and exits.
"""

import json
import os
import select
import signal
import socket
import sys

from ..core.exits import run_as_main

#: The largest message: a task's whole environment fits many times over.
MESSAGE_BYTES = 1 << 20
_PR_SET_PDEATHSIG = 1


def _send(sock, message, fds=()):
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


#: What TF1 mode's install and runner import, besides TensorFlow.
PRELOADED = ("tfcluster.estimator", "tfcluster.tf1.contrib", "tfcluster.tf1.overrides", "tfcluster.tf1.__main__")


def _said(sock, message) -> bool:
    """Send ``message``; False once the launcher is gone."""
    try:
        _send(sock, message)
        return True
    except OSError:
        return False


def preload():
    """Import what every TF1-mode task imports before its script: TensorFlow, tf-keras, the Estimator, TF1 mode."""
    import importlib
    from ..topology.taskenv import import_tensorflow, prepare_this_process
    prepare_this_process()
    import_tensorflow()
    for name in PRELOADED:
        importlib.import_module(name)
    try:
        importlib.import_module("tf_keras")      # tf.layers' home in TF1 mode, where installed
    except ImportError:
        pass


def _child(request, fds, sock, server_pid):
    """In the forked task: become the task ``request`` describes, run its command, exit with its code.

    ``fds``: the task's output pipe, or its stdout and its stderr pipes."""
    out_fd, err_fd = fds[0], fds[-1]
    try:
        os.setsid()
        from ..core import posix
        prctl = posix.prctl()
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != server_pid:       # the server died before prctl took effect
            os._exit(1)
        sock.close()
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if request.get("cgroup"):
            # Charged to its limit from here on, as a started task is from its first page (launch/memory.py).
            try:
                with open(os.path.join(request["cgroup"], "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
            except OSError as e:
                os.write(err_fd, f"tfcluster: error: cannot join memory cgroup {request['cgroup']}: "
                                 f"{e.strerror}\n".encode())
                os._exit(1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.close(devnull)
        for fd in set(fds):
            os.close(fd)
        os.chdir(request["cwd"])
        kept = {k: os.environ[k] for k in _SET_BY_PRELOAD if k in os.environ}
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.update(kept)
        # The same stream objects (loggers made at import hold them), now on the task's pipe; buffered as
        # `python` would buffer them in the task's environment.
        sys.stdout.reconfigure(line_buffering=True, write_through=bool(os.environ.get("PYTHONUNBUFFERED")))
        sys.stderr.reconfigure(line_buffering=True, write_through=True)
        _reseed()
        run_as_main(_run, request.get("module", TF1_MODE), request["argv"], forked=True)
    finally:        # reached only when the task could not be set up
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(1)


#: The module of a TF1-mode task's command (``python -m tfcluster.tf1 SCRIPT``).
TF1_MODE = "tfcluster.tf1"


def _run(module: str, argv) -> int:
    """Run the task's ``python -m MODULE ARGV``: TF1 mode's main, or (the hosted ps's ``tfcluster start``) the
    module as ``python -m`` runs it."""
    if module == TF1_MODE:
        from .__main__ import main
        return main(argv)
    import runpy
    sys.argv = [module] + list(argv)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


#: Variables TF1 mode's preparation sets before TensorFlow is imported; a forked task keeps them.
_SET_BY_PRELOAD = ("TF_USE_LEGACY_KERAS",)


def _reseed():
    """Give the task its own random streams: a fork copies the server's (Python's and NumPy's global ones)."""
    import random
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(int.from_bytes(os.urandom(4), "little"))


def _returncode(pid):
    """The exit of ``pid`` as Popen's returncode if it has ended, else None; the task stays unreaped."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def serve(sock):
    """Answer the launcher until it closes the socket; returns the exit code."""
    server_pid = os.getpid()
    running, ended = set(), set()
    while True:
        readable, _, _ = select.select([sock], [], [], 0.05)
        for pid in sorted(running - ended):
            code = _returncode(pid)
            if code is not None:
                ended.add(pid)
                if not _said(sock, {"exit": pid, "code": code}):
                    readable = None
                    break
        if readable is None:
            break
        if not readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 2)
        except OSError:
            break
        if not data:
            break
        message = json.loads(data)
        if "reap" in message:
            pid = message["reap"]
            if pid in ended:
                os.waitpid(pid, 0)
                running.discard(pid)
                ended.discard(pid)
            continue
        request = message["spawn"]
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, fds, sock, server_pid)
        for fd in fds:
            os.close(fd)
        running.add(pid)
        if not _said(sock, {"pid": pid}):
            break
    for pid in running:             # the launcher is gone: nothing it started outlives it
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return 0


def main(argv=None) -> int:
    """Preload, say ready, serve the launcher on the inherited socket."""
    argv = sys.argv[1:] if argv is None else argv
    sock = socket.socket(fileno=int(argv[0]))
    try:
        preload()
    except Exception as e:  # noqa: BLE001 - the launcher names it in one line
        _said(sock, {"error": f"{type(e).__name__}: {e}"})
        return 2
    return serve(sock) if _said(sock, {"ready": True}) else 0


if __name__ == "__main__":
    run_as_main(main)
