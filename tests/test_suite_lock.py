"""The suite's own rule for parallel runs (tests/conftest.py): serial tests run one at a time, one file's back to
back; beside them the other worker runs the rest at nice 19 where it can renice (CAP_SYS_NICE, as in CI), and
waits otherwise (TFCLUSTER_TESTS_SERIAL_ALONE=1), once per file, not once per test.

Each case runs a small suite of sleeping tests under pytest-xdist with this repo's conftest.py and pytest.ini's
worker settings, and reads the order in which the tests started and ended.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import BESIDE_NICE, REPO, base_env, can_renice

SLEEPER = """
import os, time, pytest
{mark}
@pytest.mark.parametrize("i", range({n}))
def test_sleeps(i):
    with open({log!r}, "a") as f:
        f.write(f"{{time.time():.3f}} start {name}{{i}}\\n")
    with open({log!r} + ".nice", "a") as f:
        f.write(f"{name}{{i}} {{os.getpriority(os.PRIO_PROCESS, 0)}}\\n")
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
        mark = "pytestmark = pytest.mark.serial" if serial else ""
        (tmp_path / f"test_{name}.py").write_text(SLEEPER.format(mark=mark, n=n, log=log, name=name))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=90, env=base_env(**({"TFCLUSTER_TESTS_SERIAL_ALONE": "1"} if alone else {})))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = sorted(open(log).read().split("\n")[:-1], key=lambda line: float(line.split()[0]))
    return [line.split(None, 1)[1] for line in lines]


@pytest.mark.timeout(120)
def test_a_files_serial_tests_run_back_to_back_with_nothing_beside_them(tmp_path):
    events = ran(tmp_path, {"alone": (True, 4), "left": (False, 4), "right": (False, 4)})
    alone = [i for i, e in enumerate(events) if e.endswith(tuple(f"alone{k}" for k in range(4)))]
    # Four serial tests: eight events in a row, each test's end before the next test's start.
    assert alone == list(range(alone[0], alone[0] + 8)), events
    assert events[alone[0]:alone[0] + 8] == [f"{edge} alone{k}" for k in range(4) for edge in ("start", "end")]
    # The shared files' tests overlapped outside that stretch: two workers ran them side by side.
    shared = events[:alone[0]] + events[alone[0] + 8:]
    assert any(a.startswith("start") and b.startswith("start") for a, b in zip(shared, shared[1:])), events


@pytest.mark.timeout(120)
def test_two_files_serial_tests_each_run_whole_and_neither_waits_for_the_other_forever(tmp_path):
    # The worker that holds one file's lock gives it up at the file's end; both files run, each in one piece.
    events = ran(tmp_path, {"first": (True, 3), "second": (True, 3), "shared": (False, 6)})
    for name in ("first", "second"):
        mine = [i for i, e in enumerate(events) if re.search(rf" {name}\d$", e)]
        assert mine == list(range(mine[0], mine[0] + 6)), events


@pytest.mark.timeout(120)
@pytest.mark.skipif(not can_renice(), reason="a worker can lower its nice only with CAP_SYS_NICE (root, as in CI)")
def test_where_workers_can_renice_the_rest_runs_beside_serial_tests_at_the_lowest_priority(tmp_path):
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
    nice = dict(line.split() for line in open(tmp_path / "log.nice").read().splitlines())
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert {n for t, n in nice.items() if t.startswith("shared")} == {str(max(base, BESIDE_NICE))}, nice
    assert {n for t, n in nice.items() if not t.startswith("shared")} == {str(base)}, nice
