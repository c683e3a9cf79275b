"""A task that never finishes by itself, with a process tree to clean up.

It prints its pid, starts one grandchild in its own process group and one in a
new session (which escapes a process-group kill), prints their pids and
"ready", then sleeps. With --exit-after S it exits 0 after S seconds instead.
"""
import argparse
import os
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--exit-after", type=float)
p.add_argument("--no-tree", action="store_true")
args, _ = p.parse_known_args()
print(f"pid {os.getpid()}", flush=True)
if not args.no_tree:
    nap = [sys.executable, "-c", "import time; time.sleep(600)"]
    same_group = subprocess.Popen(nap)
    own_session = subprocess.Popen(nap, start_new_session=True)
    print(f"grandchildren {same_group.pid} {own_session.pid}", flush=True)
print("ready", flush=True)
time.sleep(args.exit_after if args.exit_after is not None else 600)
