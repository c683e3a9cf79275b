"""Reproduce TF 2.21's false ``AbortedError: The same RunGraph (Worker) request was received twice``.

Usage: python scripts/repro_request_twice.py [--threads 4] [--seconds 240] [--churn-only]

What it does: one in-process gRPC server (``create_local_server``), one cheap
op (``v.assign_add(1)``), and THREADS Python threads calling ``sess.run`` on
it until SECONDS have passed (as queue runners do). It counts the runs and the
duplicate-request aborts, and compares the count with what the suspected cause
predicts:

- TF 2.21 draws each RunGraph request id from a *thread-local* mt19937_64
  seeded with one 32-bit value of /dev/urandom (``GetUniqueRequestId`` ->
  ``tsl::random::ThreadLocalNew64``);
- the master runs every step on a newly spawned thread (``Env::SchedClosure``),
  so each step's id is the first draw of a freshly seeded generator: one of
  only 2**32 values;
- the worker rejects any id among the last 100,000 it has seen.

So the i-th step collides with probability min(i, 100000) / 2**32, and the
expected number of aborts after N steps is sum_i min(i, 100000) / 2**32
(about 1.2 at N = 100,000, then one more per ~43,000 steps). The script also
samples the process's thread ids while it runs, to show that new threads
appear at the step rate (the precondition of the cause).

Bounded: it stops after SECONDS whatever happens. On a shared 2-core machine it
made 2,000-4,000 steps per second, so the default 4 minutes predict about 10-20
aborts (measured: 11 in 710k steps with 4 threads, 12 in 361k with 1 thread;
docs/tf1.md). Under ``python -m tfcluster.tf1`` the same run reports none: TF1
mode reruns each rejected step and says so on stderr.
"""

import argparse
import os
import sys
import threading
import time

WINDOW = 100_000        # Worker's RecentRequestIds capacity for RunGraph in TF 2.21
ID_SPACE = 2 ** 32      # seeds of a std::random_device()-seeded mt19937_64
MARK = "request was received twice"


def expected_aborts(steps: int) -> float:
    """Aborts predicted by the 32-bit-seed model after ``steps`` RunGraph requests."""
    full = max(0, steps - WINDOW)
    ramp = min(steps, WINDOW)
    return (ramp * (ramp - 1) / 2 + full * WINDOW) / ID_SPACE


def thread_ids():
    try:
        return set(int(t) for t in os.listdir("/proc/self/task"))
    except OSError:
        return set()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--seconds", type=float, default=240.0)
    p.add_argument("--churn-only", action="store_true", help="only measure thread churn for 5 s")
    args = p.parse_args(argv)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    server = tf1.train.Server.create_local_server()
    v = tf1.Variable(0.0)
    op = v.assign_add(1.0)
    sess = tf1.Session(server.target)
    sess.run(v.initializer)

    deadline = time.monotonic() + (5.0 if args.churn_only else args.seconds)
    counts = {"runs": 0, "aborts": 0, "other": 0}
    lock = threading.Lock()
    first, abort_steps = [], []

    def loop():
        n = a = o = 0
        while time.monotonic() < deadline:
            try:
                sess.run(op)
                n += 1
            except tf.errors.AbortedError as e:
                if MARK in str(e):
                    a += 1
                    at = sess.run(v)  # the step count when it happened
                    with lock:
                        abort_steps.append(int(at))
                    if not first:
                        first.append(next(l for l in str(e).splitlines() if MARK in l)[:160])
                else:
                    o += 1
        with lock:
            counts["runs"] += n
            counts["aborts"] += a
            counts["other"] += o

    workers = [threading.Thread(target=loop, daemon=True) for _ in range(args.threads)]
    start = time.monotonic()
    for w in workers:
        w.start()
    # Thread churn: how many distinct thread ids appear while steps run.
    seen, samples, churn_end = set(), 0, time.monotonic() + 3.0
    steps_before = sess.run(v)
    while time.monotonic() < churn_end:
        seen |= thread_ids()
        samples += 1
        time.sleep(0.005)
    steps_during = sess.run(v) - steps_before
    steady = len(thread_ids())
    print(f"thread churn: {len(seen)} distinct thread ids seen in 3 s ({samples} samples) while "
          f"{int(steps_during)} steps ran; {steady} threads alive at a time", flush=True)
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()) + 60)
    elapsed = time.monotonic() - start
    steps = counts["runs"] + counts["aborts"]
    print(f"{args.threads} thread(s), {elapsed:.0f} s: {counts['runs']} runs ({counts['runs'] / elapsed:.0f}/s), "
          f"{counts['aborts']} duplicate-request abort(s), {counts['other']} other abort(s)")
    print(f"the 32-bit-seed model predicts {expected_aborts(steps):.2f} abort(s) for {steps} steps "
          f"(window {WINDOW}, id space 2**32)")
    if first:
        print("first abort:", first[0])
        print("aborts at steps:", ", ".join(str(a) for a in sorted(abort_steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
