"""The suite's own rule for parallel runs (tests/conftest.py): serial tests run one at a time, one file's back to
back, the other worker waiting once per file, not once per test; files with serial tests go first, then the
longest files of a recorded run; tests in network namespaces run beside the rest.

Each case runs a small suite of sleeping tests under pytest-xdist with this repo's conftest.py and pytest.ini's
worker settings, and reads the order in which the tests started and ended.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, base_env

SLEEPER = """
import os, time, pytest
{mark}
@pytest.mark.parametrize("i", range({n}))
def test_sleeps(i):
    with open({log!r}, "a") as f:
        f.write(f"{{time.time():.3f}} start {name}{{i}}\\n")
    time.sleep(0.3)
    with open({log!r}, "a") as f:
        f.write(f"{{time.time():.3f}} end {name}{{i}}\\n")
"""


def ran(tmp_path, files, seconds=None):
    """Run ``files`` (name -> (serial?, number of tests)) on two workers, with ``seconds`` (file name -> seconds)
    as the recorded seconds per file; the tests' starts and ends in order."""
    for name in ("conftest.py", "held_ports.py"):         # conftest.py and the helper it imports
        shutil.copy(os.path.join(REPO, "tests", name), tmp_path / name)
    if seconds:
        (tmp_path / "file_seconds.json").write_text(json.dumps({f"test_{k}.py": v for k, v in seconds.items()}))
    with open(os.path.join(REPO, "pytest.ini")) as f:
        addopts = next(line.rstrip("\n") for line in f if line.startswith("addopts"))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    serial: alone\n    netns: namespaces\n"
                                         f"{addopts} -p no:cacheprovider\n")
    log = str(tmp_path / "log")
    for name, (serial, n) in files.items():
        mark = {True: "pytestmark = pytest.mark.serial", "netns": "pytestmark = pytest.mark.netns"}.get(serial, "")
        (tmp_path / f"test_{name}.py").write_text(SLEEPER.format(mark=mark, n=n, log=log, name=name))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=240, env=base_env())
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
def test_tests_in_network_namespaces_run_beside_the_rest(tmp_path):
    # Each makes namespaces of its own (tests/netns.py): nothing to wait for.
    events = ran(tmp_path, {"hosts": ("netns", 3), "shared": (False, 3)})
    assert any(a.startswith("start") and b.startswith("start") for a, b in zip(events, events[1:])), events


@pytest.mark.timeout(300)
def test_files_with_serial_tests_start_first_so_the_run_ends_on_tests_run_side_by_side(tmp_path):
    # Collected last (alphabetically), handed out first: both workers begin on a serial file.
    events = ran(tmp_path, {"a_shared": (False, 2), "b_shared": (False, 2), "y_alone": (True, 2),
                            "z_alone": (True, 2)})
    assert all(re.search(r" [yz]_alone\d$", e) for e in events[:8]), events


@pytest.mark.timeout(300)
def test_the_longest_files_of_a_recorded_run_are_handed_out_first(tmp_path):
    # Collected first, recorded short: handed out after the long one, so the run does not end on the long file.
    events = ran(tmp_path, {"a_short": (False, 2), "b_short": (False, 2), "z_long": (False, 2)},
                 seconds={"a_short": 1, "b_short": 2, "z_long": 100})
    assert "start z_long0" in events[:2] and "start a_short0" not in events[:2], events


@pytest.mark.timeout(300)
def test_two_files_serial_tests_each_run_whole_and_neither_waits_for_the_other_forever(tmp_path):
    # The worker that holds one file's lock gives it up at the file's end; both files run, each in one piece.
    events = ran(tmp_path, {"first": (True, 3), "second": (True, 3), "shared": (False, 6)})
    for name in ("first", "second"):
        mine = [i for i, e in enumerate(events) if re.search(rf" {name}\d$", e)]
        assert mine == list(range(mine[0], mine[0] + 6)), events
