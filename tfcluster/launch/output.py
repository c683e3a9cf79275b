"""What the launcher shows: whole lines from many tasks, and why a task failed.

Every task's output reaches the terminal line by line with its task's prefix
(``[worker:1] ...``) through one :class:`LineWriter`, so lines of different
tasks never interleave mid-line (and, with ``timestamps``, each starts with the
time it arrived); :func:`failure_cause` picks, from a failed task's last lines,
the one that says why.
"""

import datetime
import re
import sys
import threading
from typing import Optional

#: The last line of a Python traceback: ``ValueError: bad value`` (module path allowed).
_EXCEPTION_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt))(?::\s*(.*))?")
#: A one-line error as argparse, tfcluster (and tfcluster start) and the examples print it: ``PROG: error: ...``
#: (after the time, in tfcluster's log lines).
_TFCLUSTER_ERROR = re.compile(r"(?:\S+ )?[\w.-]+: error: (.+)")
#: What a program run without a mode fails with when it uses the Estimator, which is TF1 mode's (docs/tf2.md).
_ESTIMATOR = ("No module named 'tensorflow.python.distribute.estimator_training'", "name 'estimator_training'",
              "module 'tensorflow' has no attribute 'estimator'", "No module named 'tensorflow.python.estimator'")
_ESTIMATOR_HINT = ("; the program uses the Estimator, which TF 2.21 no longer has: run it in TF1 mode (--tf1), where "
                   "tf.estimator and tensorflow_estimator are tfcluster's Estimator")


def failure_cause(lines) -> Optional[str]:
    """What a failed task said last about why: its final exception line, without the module path, or the
    message of a one-line error in the argparse convention (``tfcluster: error: ...``, ``train.py: error: ...``)."""
    for line in reversed(list(lines)):
        line = line.strip()
        m = _EXCEPTION_LINE.fullmatch(line)
        own = _TFCLUSTER_ERROR.fullmatch(line)
        if m:
            text = m.group(1) + (f": {m.group(2).strip()}" if m.group(2) and m.group(2).strip() else "")
        elif own:
            text = own.group(1).strip()
        elif "can't open file" in line:
            text = line
        else:
            continue
        # Room for a long op name and TF's cause after it (an estimator's ops are nested 5 scopes deep).
        text = text if len(text) <= 300 else text[:297] + "..."
        return text + (_ESTIMATOR_HINT if any(words in text for words in _ESTIMATOR) else "")
    return None


class LineWriter:
    """Writes whole lines to a text stream from many threads without interleaving them.

    ``timestamps``: each line starts with the time it was written (``12:03:04.125``).
    """

    def __init__(self, stream=None, timestamps: bool = False):
        self.stream = stream if stream is not None else sys.stdout
        self.timestamps = timestamps
        self._lock = threading.Lock()
        self._broken = False

    def line(self, text: str):
        """Write ``text`` (one line, newline added if missing) and flush."""
        if not text.endswith("\n"):
            text += "\n"
        if self.timestamps:
            text = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3] + " " + text
        with self._lock:
            if self._broken:
                return
            try:
                self.stream.write(text)
                self.stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                # The reader of our output went away (``| head``); the log
                # files still get every line, so keep supervising.
                self._broken = True
