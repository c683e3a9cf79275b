"""How tfcluster reads TensorFlow's errors: one line of each, and which ones a lost task causes.

TF's messages run to many lines: a ruler, a "Graph execution error:" header,
the op's traceback, and for a remote failure "From /job:ps/...:" before the
cause. A user gets one line with the cause and, when another task failed the
call, that task's name.
"""

import re

_FROM_TASK = re.compile(r"(?:[A-Z_]+: )?From (/job:\S+?):")
_REMOTE = re.compile(r"from remote target (/job:\S+) while calling")
_FROM_TASK_PREFIX = re.compile(r"(?:[A-Z_]+: )?From /job:([\w-]+)/replica:\d+/task:(\d+): (.*)")


def _lines(error) -> list:
    text = getattr(error, "message", None) or str(error)
    lines, in_trace = [], False
    for line in (raw.strip() for raw in text.splitlines()):
        # TF 2.x puts the op's Python traceback first ("Detected at node ... Node: 'x'"), the cause after it.
        if line.startswith("Detected at node"):
            in_trace = True
        elif in_trace:
            in_trace = not line.startswith("Node: ")
        elif line.strip("=-~ \t") and line != "Graph execution error:" and not line.startswith(("[[", "Hint:")):
            lines.append(line)
    return lines


def summary(error, prefer: str = "") -> str:
    """The one line of ``error`` that says what went wrong (the first line starting with ``prefer``, if any)."""
    lines = _lines(error)
    if not lines:
        return type(error).__name__
    if prefer:
        preferred = next((line for line in lines if line.startswith(prefer)), None)
        if preferred is not None:
            return preferred
    m = _FROM_TASK.fullmatch(lines[0])
    if m and len(lines) > 1:
        # The task that failed the call, rather than this task's master relaying it.
        remote = _REMOTE.search(getattr(error, "message", None) or str(error))
        return f"{remote.group(1) if remote else m.group(1)}: {lines[1]}"
    return lines[0]


def describe(error, limit: int = 300) -> str:
    """``AbortedError: <summary>``, at most ``limit`` characters."""
    return f"{type(error).__name__}: {summary(error)}"[:limit]


def cause(error, limit: int = 400) -> str:
    """The op that failed and every line of its cause, joined (an assertion's values are lines of their own)."""
    op = getattr(getattr(error, "op", None), "name", None)
    text = " ".join(_lines(error)) or type(error).__name__
    m = _FROM_TASK_PREFIX.fullmatch(text)
    where = f" on {m.group(1)}:{m.group(2)}" if m else ""       # the task that ran the op, said briefly
    text = m.group(3) if m else text
    return (f"{op}{where}: {text}" if op else f"{where.strip()}: {text}" if where else text)[:limit]


#: What TF 1.x's canned heads' checks on the data mean, in the words of their arguments.
_HINTS = [("Labels must <= n_classes - 1", "a label is outside n_classes"),
          ("Labels must >= 0", "a label is negative, or not in label_vocabulary (its lookup gives -1)"),
          ("/head/weights/Cast", "weight_column must name a numeric feature")]
#: An id outside its table. Two ops check a lookup's ids and either may fail first (the executor runs them
#: in any order): the gather says "indices[1] = 12 is not in [0, 10)", the segment sum "indices[1] == 12 out of range".
_ID_OUTSIDE = re.compile(r"indices\[[\d,]+\] ={1,2} -?\d+ (?:is not in|out of range) \[0, ?\d*")


def hint(text: str) -> str:
    """`` (what it means)`` for a canned head's check or an id outside its table in ``text``, else ``""``."""
    meanings = [meaning for marker, meaning in _HINTS if marker in text]
    if _ID_OUTSIDE.search(text):
        meanings.append("an id is outside its table: a categorical column's num_buckets, hash_bucket_size or "
                        "vocabulary, or a table's rows")
    return "".join(f" ({meaning})" for meaning in meanings)


#: TF's coordination service names trainers that stopped sending heartbeats, a task per line after these words.
_UNHEALTHY = re.compile(r"tasks are unhealthy \(stopped sending heartbeats\):((?:\s*/job:\S+)+)")
_TASK = re.compile(r"/job:([\w-]+)/replica:\d+/task:(\d+)")
#: gRPC's words for a peer whose process is gone (its socket closed under a call, or nobody listening).
_GONE = ("Connection reset by peer", "Socket closed", "Connection refused", "failed to connect to all addresses",
         "Broken pipe")


def lost_peers(error):
    """``(tasks, how)`` when ``error`` says other tasks are gone (``(["worker:1"], "heartbeats")``: TF's
    coordination service heard no heartbeat from them; ``"connection"``: a call to them lost its connection),
    else None. Tasks are named as tfcluster names them (``worker:1``, ``chief:0``)."""
    text = getattr(error, "message", None) or str(error)
    m = _UNHEALTHY.search(text)
    if m:
        return [f"{job}:{index}" for job, index in _TASK.findall(m.group(1))], "heartbeats"
    remote = _REMOTE.search(text)
    if remote and any(words in text for words in _GONE):
        return [f"{job}:{index}" for job, index in _TASK.findall(remote.group(1))], "connection"
    return None


def recoverable(error) -> bool:
    """True for the errors a lost task causes: Aborted, Unavailable, and variables gone with a ps."""
    import tensorflow as tf
    if isinstance(error, (tf.errors.AbortedError, tf.errors.UnavailableError)):
        # (a false duplicate lands here only after its reruns failed too)
        return True
    # A ps that came back empty: its variables are uninitialised until the chief restores them.
    return isinstance(error, tf.errors.FailedPreconditionError) and "uninitialized" in str(error).lower()
