"""The suite's own rule for parallel runs (tests/conftest.py): serial tests run one at a time, one file's back to
back, the other worker waiting once per file, not once per test; with TFCLUSTER_TESTS_BESIDE=1 it runs the rest
beside them in a cpu group of low weight instead.

Each case runs a small suite of sleeping tests under pytest-xdist with this repo's conftest.py and pytest.ini's
worker settings, and reads the order in which the tests started and ended.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, base_env, can_run_beside, cpu_cgroup

SLEEPER = """
import os, time, pytest
from conftest import cpu_cgroup
{mark}
@pytest.mark.parametrize("i", range({n}))
def test_sleeps(i):
    with open({log!r}, "a") as f:
        f.write(f"{{time.time():.3f}} start {name}{{i}}\\n")
    with open({log!r} + ".cgroup", "a") as f:
        f.write(f"{name}{{i}} {{cpu_cgroup()}}\\n")
    time.sleep(0.3)
    with open({log!r}, "a") as f:
        f.write(f"{{time.time():.3f}} end {name}{{i}}\\n")
"""


def ran(tmp_path, files, alone=True):
    """Run ``files`` (name -> (serial?, number of tests)) on two workers, serial tests ``alone`` or beside the
    rest; the tests' starts and ends in order."""
    shutil.copy(os.path.join(REPO, "tests", "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    serial: alone\n    netns: namespaces\n"
                                         "addopts = -n 2 --dist loadfile -p no:cacheprovider\n")
    log = str(tmp_path / "log")
    for name, (serial, n) in files.items():
        mark = {True: "pytestmark = pytest.mark.serial", "netns": "pytestmark = pytest.mark.netns"}.get(serial, "")
        (tmp_path / f"test_{name}.py").write_text(SLEEPER.format(mark=mark, n=n, log=log, name=name))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=240, env=base_env(TFCLUSTER_TESTS_BESIDE="0" if alone else "1"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = sorted(open(log).read().split("\n")[:-1], key=lambda line: float(line.split()[0]))
    return [line.split(None, 1)[1] for line in lines]


@pytest.mark.timeout(300)
def test_a_files_serial_tests_run_back_to_back_with_nothing_beside_them(tmp_path):
    events = ran(tmp_path, {"alone": (True, 4), "left": (False, 4), "right": (False, 4)})
    alone = [i for i, e in enumerate(events) if e.endswith(tuple(f"alone{k}" for k in range(4)))]
    # Four serial tests: eight events in a row, each test's end before the next test's start.
    assert alone == list(range(alone[0], alone[0] + 8)), events
    assert events[alone[0]:alone[0] + 8] == [f"{edge} alone{k}" for k in range(4) for edge in ("start", "end")]
    # The shared files' tests overlapped outside that stretch: two workers ran them side by side.
    shared = events[:alone[0]] + events[alone[0] + 8:]
    assert any(a.startswith("start") and b.startswith("start") for a, b in zip(shared, shared[1:])), events


@pytest.mark.timeout(300)
def test_a_test_in_network_namespaces_is_a_serial_one(tmp_path):
    events = ran(tmp_path, {"hosts": ("netns", 3), "left": (False, 4), "right": (False, 4)})
    hosts = [i for i, e in enumerate(events) if re.search(r" hosts\d$", e)]
    assert events[hosts[0]:hosts[0] + 6] == [f"{edge} hosts{k}" for k in range(3) for edge in ("start", "end")], events


@pytest.mark.timeout(300)
def test_two_files_serial_tests_each_run_whole_and_neither_waits_for_the_other_forever(tmp_path):
    # The worker that holds one file's lock gives it up at the file's end; both files run, each in one piece.
    events = ran(tmp_path, {"first": (True, 3), "second": (True, 3), "shared": (False, 6)})
    for name in ("first", "second"):
        mine = [i for i, e in enumerate(events) if re.search(rf" {name}\d$", e)]
        assert mine == list(range(mine[0], mine[0] + 6)), events


@pytest.mark.timeout(300)
@pytest.mark.skipif(not can_run_beside(), reason="no cgroup v1 cpu controller this run may write (root, as in CI)")
def test_where_a_cpu_group_can_be_made_the_rest_runs_beside_serial_tests_on_the_cpu_they_leave(tmp_path):
    events = ran(tmp_path, {"first": (True, 3), "second": (True, 3), "shared": (False, 12)}, alone=False)
    serial = [e for e in events if re.search(r" (first|second)\d$", e)]
    # Serial tests never overlap each other: each one's end comes before the next one's start.
    assert serial == [f"{edge} {name}{k}" for name in ("first", "second") for k in range(3)
                      for edge in ("start", "end")] or serial == [f"{edge} {name}{k}" for name in ("second", "first")
                                                                 for k in range(3) for edge in ("start", "end")], events
    # The other worker did not wait: shared tests started while a serial one ran.
    running, beside = None, 0
    for e in events:
        edge, name = e.split()
        if not name.startswith("shared"):
            running = name if edge == "start" else None
        elif edge == "start" and running:
            beside += 1
    assert beside >= 3, events
    group = dict(line.split() for line in open(tmp_path / "log.cgroup").read().splitlines())
    own = cpu_cgroup("self")
    beside = {g for t, g in group.items() if t.startswith("shared")}
    assert len(beside) == 1 and os.path.dirname(min(beside)) == own, group
    assert {g for t, g in group.items() if not t.startswith("shared")} == {own}, group
    assert not os.path.exists(min(beside))         # removed at the end
