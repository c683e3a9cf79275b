"""The suite's cleanup (tests/conftest.py) signals only processes a test started and that are still theirs.

Pids are 15 bits here and TensorFlow processes start dozens of threads each, so the number of a task that
ended is soon a thread's of another process: a signal to it ends that process (in CI, the suite's fork server).
"""

import os
import sys
import threading

from conftest import Procs, live_process, no_process_left


def test_a_threads_number_is_not_a_process():
    ready, done = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: (ready.set(), done.wait(10)))
    thread.start()
    try:
        ready.wait(10)
        assert live_process(thread.native_id) is None
        assert no_process_left([thread.native_id], timeout=0)
        assert live_process(os.getpid()).pid == os.getpid()
    finally:
        done.set()
        thread.join()


def test_a_reaped_child_is_neither_listed_nor_signalled_at_cleanup():
    procs = Procs()
    p = procs.start([sys.executable, "-c", "pass"])
    p.wait(timeout=30)
    assert procs.descendants() == []
    live = procs.start([sys.executable, "-c", "import time; time.sleep(60)"])
    assert [q.pid for q in procs.descendants()] == [live.pid]
    procs.cleanup()
    assert live.poll() is not None and p.returncode == 0      # (psutil reaps what it kills: no -9 to read)
