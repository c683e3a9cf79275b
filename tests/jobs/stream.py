"""The output of a running process, line by line, each line stamped with when it arrived.

Fault tests kill, cut and restart tasks while they run; they need to know
what a task had said before the fault (the global step it had reached, the
last checkpoint it saved) and how long after it a line appeared.
"""

import re
import threading
import time


class Stream:
    """Reads a Popen's stdout (text) in a thread; every line is kept as (monotonic time, text)."""

    def __init__(self, proc, name="process"):
        self.proc = proc
        self.name = name
        self.lines = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pattern, timeout, after=0.0, check=None):
        """The first (time, match) of ``pattern`` in a line that arrived after ``after`` (and passes
        ``check(match)``, if given); fail after ``timeout``."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for t, line in self.lines:
                    m = rx.search(line) if t >= after else None
                    if m and (check is None or check(m)):
                        return t, m
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"{self.name}: no line matching {pattern!r} within {timeout}s; last lines:\n"
                                         + self.tail())
                self._cond.wait(min(left, 0.2))

    def matches(self, pattern, after=0.0, before=float("inf")):
        """Every (time, match) of ``pattern`` in lines that arrived in [after, before)."""
        rx = re.compile(pattern)
        with self._cond:
            found = [(t, rx.search(line)) for t, line in self.lines if after <= t < before]
        return [(t, m) for t, m in found if m]

    def finish(self, timeout):
        """The exit code, once the process has exited and its output is read (fail after ``timeout``)."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(10)
        return code

    @property
    def text(self):
        with self._cond:
            return "\n".join(line for _, line in self.lines)

    def tail(self, n=40):
        with self._cond:
            return "\n".join(line for _, line in self.lines[-n:])
