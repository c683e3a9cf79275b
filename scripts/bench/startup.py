"""What start-up and plumbing cost, apart from training: loopback TCP, TensorFlow's import per kind of task, and
a TF1 run's start and end with its tasks forked or not."""

import os
import socket
import subprocess
import tempfile
import threading
import time

from runs import PY, child_env

def tcp_loopback_bps(megabytes=64, seconds=3.0):
    """Plain TCP bytes/s over loopback between two threads, the bench's own socket pair."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    payload = b"\0" * (megabytes << 20)
    received = [0]

    def sink():
        c, _ = srv.accept()
        buf = bytearray(1 << 20)
        while True:
            n = c.recv_into(buf)
            if not n:
                break
            received[0] += n
        c.close()
    t = threading.Thread(target=sink)
    t.start()
    c = socket.create_connection(srv.getsockname())
    start = time.time()
    while time.time() - start < seconds:
        c.sendall(payload)
    c.close()
    t.join()
    elapsed = time.time() - start
    srv.close()
    return received[0] / elapsed


#: Leaving at once after the import: the interpreter's teardown of TensorFlow at exit (1.3-2 s of CPU, docs/tf1.md,
#: "How they end") is not part of an import, and a hosted ps no longer pays it.
QUIT = "\nimport os\nos._exit(0)"


def tf_import_seconds():
    """Wall seconds for a fresh Python to import TensorFlow (the floor of any start-up)."""
    t = time.time()
    subprocess.run([PY, "-c", "import tensorflow" + QUIT], check=True, env=child_env(), capture_output=True)
    return time.time() - t


#: How each kind of task process imports TensorFlow: a trainer's program as written (Keras with it; tf-keras under
#: TF_USE_LEGACY_KERAS, which every task gets where tf-keras is installed), a hosted ps as tfcluster start does.
IMPORTS = {"trainer": "import tensorflow",
           "ps": "from tfcluster.topology.taskenv import prepare_this_process\n"
                 "prepare_this_process(keras=False)\nimport tensorflow"}


def import_cost(kind):
    """``(CPU seconds, peak resident bytes)`` of a fresh Python importing TensorFlow as a ``kind`` task does."""
    p = subprocess.Popen([PY, "-c", IMPORTS[kind] + QUIT], env=child_env(TF_USE_LEGACY_KERAS="1"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)      # the kernel's accounting of this one child
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise RuntimeError(f"importing TensorFlow as a {kind} exited {p.returncode}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def tf1_run_cost(fork):
    """``(wall seconds, CPU seconds)`` of ``tfcluster local --tf1`` (1 ps + 2 workers) running a script that only
    imports TensorFlow: the start and end of a TF1 cluster, with its tasks forked or each importing its own."""
    with tempfile.TemporaryDirectory(prefix="tfcbench-tf1-") as tmp:
        script = os.path.join(tmp, "empty.py")
        with open(script, "w") as f:
            f.write("import tensorflow as tf\nprint(tf.__version__)\n")
        t = time.monotonic()
        p = subprocess.Popen([PY, "-m", "tfcluster", "local", "--tf1", "--ps", "1", "--workers", "2", "--log-dir",
                              os.path.join(tmp, "logs")] + ([] if fork else ["--no-fork"]) + ["--", PY, script],
                             env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
        _, status, usage = os.wait4(p.pid, 0)       # the launcher, and every process it and they reaped
        if os.waitstatus_to_exitcode(status):
            raise RuntimeError(f"tfcluster local --tf1 {'' if fork else '--no-fork '}exited "
                               f"{os.waitstatus_to_exitcode(status)}")
        return time.monotonic() - t, usage.ru_utime + usage.ru_stime
