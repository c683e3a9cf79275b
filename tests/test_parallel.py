"""Tests run two at a time (pytest-xdist), and a test that must have the machine to itself has it.

tests/conftest.py's :class:`Turns` is a readers-writer lock on two files
that every worker opens: a test holds the room shared, an ``alone`` test
alone, and an ``alone`` test waiting at the gate keeps new tests out until
the room is empty. Each "worker" here is a thread with its own open files,
as each xdist worker is a process with its own.
"""

import threading
import time

import pytest

from conftest import ALONE, Turns


def _turns(folder):
    return Turns(str(folder))


@pytest.fixture
def folder(tmp_path):
    return tmp_path


def test_two_shared_tests_run_at_once(folder):
    one, two = _turns(folder), _turns(folder)
    one.enter(alone=False)
    entered = threading.Event()
    threading.Thread(target=lambda: (two.enter(alone=False), entered.set()), daemon=True).start()
    assert entered.wait(10), "a second shared test waited for the first"
    one.leave()
    two.leave()


def test_an_alone_test_waits_for_the_room_to_empty_and_keeps_new_tests_out_meanwhile(folder):
    shared, alone, late = _turns(folder), _turns(folder), _turns(folder)
    shared.enter(alone=False)
    events = []
    got_alone = threading.Event()

    def alone_test():
        alone.enter(alone=True)
        events.append("alone in")
        got_alone.set()
        time.sleep(0.3)
        events.append("alone out")
        alone.leave()
    threading.Thread(target=alone_test, daemon=True).start()
    time.sleep(0.3)                                 # the alone test now waits at the gate, holding it
    late_in = threading.Event()
    threading.Thread(target=lambda: (late.enter(alone=False), events.append("late in"), late_in.set()),
                     daemon=True).start()
    time.sleep(0.3)
    assert events == [], "nothing may start while a test holds the room shared and an alone test waits"
    shared.leave()
    assert got_alone.wait(10) and late_in.wait(10)
    assert events == ["alone in", "alone out", "late in"]   # the waiting alone test first, then the late one
    late.leave()


def test_the_modules_that_run_alone_say_why():
    assert ALONE and all(isinstance(why, str) and why for why in ALONE.values())
