"""Python objects between Horovod's ranks: ``broadcast_object`` and ``allgather_object`` (Horovod 0.20+).

An object is pickled into bytes, its length and bytes sent by
:mod:`.tensorflow`'s collectives in a graph and session of their own (so the
program's graph gains nothing), and unpickled. Every rank calls them in the
same order; the n-th call of each rank is one collective, as Horovod names it.
"""

import io
import itertools
import pickle

import numpy as np

from . import tensorflow as hvd

__all__ = ["broadcast_object", "allgather_object"]

_calls = itertools.count()


def _words(obj):
    """``(obj pickled as int64 words, its length in bytes)``: TF's collectives carry no uint8."""
    buffer = io.BytesIO()
    pickle.dump(obj, buffer)
    data = buffer.getvalue()
    return np.frombuffer(data + b"\0" * (-len(data) % 8), np.int64), len(data)


def _object(words, length):
    return pickle.loads(np.asarray(words, np.int64).tobytes()[:length])


def _run(build):
    """``build()``'s tensors, evaluated in a graph and session of their own on this rank's server."""
    import tensorflow as tf
    with tf.Graph().as_default():
        fetches = build()
        with tf.compat.v1.Session() as session:
            return session.run(fetches)


def broadcast_object(obj, root_rank=0, session=None, name=None):
    """``root_rank``'s ``obj`` on every rank (pickled)."""
    if hvd.size() == 1:
        return obj
    import tensorflow as tf
    # Named by the call, not the object's type: the other ranks often pass None.
    name = f"HorovodBroadcastObject_{name or ''}_{next(_calls)}"
    root = hvd.rank() == root_rank
    words, length = _words(obj) if root else (None, 0)
    length = int(_run(lambda: hvd.broadcast(tf.constant([length], tf.int64), root_rank, name=f"{name}_length"))[0])
    sent = words if root else np.zeros(-(-length // 8), np.int64)
    got = _run(lambda: hvd.broadcast(tf.constant(sent), root_rank, name=f"{name}_bytes"))
    return obj if root else _object(got, length)


def allgather_object(obj, session=None, name=None):
    """Every rank's ``obj``, as a list in rank order (pickled)."""
    if hvd.size() == 1:
        return [obj]
    import tensorflow as tf
    name = f"HorovodAllgatherObject_{name or ''}_{next(_calls)}"
    words, length = _words(obj)
    lengths, data = _run(lambda: (hvd.allgather(tf.constant([length], tf.int64), name=f"{name}_lengths"),
                                  hvd.allgather(tf.constant(words), name=f"{name}_bytes")))
    counts = [-(-int(n) // 8) for n in lengths]
    ends = np.cumsum(counts)
    return [_object(data[end - c:end], int(n)) for c, end, n in zip(counts, ends, lengths)]
