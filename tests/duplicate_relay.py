"""A gRPC relay in front of a task's server that makes TF 2.21's false duplicate happen for real, on demand.

TF's workers reject a ``RunGraph`` request whose ``request_id`` they saw in
their last 100,000 requests ("The same RunGraph (Worker) request was received
twice"), and TF 2.21 draws those ids so that a new one repeats an old one
about once in 43,000 steps (tfcluster/core/duplicates.py, docs/pitfalls.md item
15). Waiting for that in a test takes hours; this relay makes the repeat
itself: every call of TF's ``WorkerService`` passes through unchanged, byte for
byte, except that an armed ``RunGraph`` request is sent upstream with the id
of the request before it. The server behind the relay is a real TF server and
rejects it as it rejects a colliding id, and the master that sent the step
reports it as it reports a collision: an ``AbortedError``, or a
``CancelledError`` of the step's part that waited on the rejected one with the
abort after it (issue 67), whichever TF's race between cancelling that wait and
aborting the step gives.

A task's cluster names the relay's address for the task behind it; that task
binds its own port (``tf.train.ServerDef.port`` in one process, its own
cluster file when it is a process of its own).

As a program (``python tests/duplicate_relay.py --upstream HOST:PORT --every N
--port-file F --count-file C``) it serves until SIGTERM, writes its port to F
once it listens and, at the end, how many ids it repeated to C.
"""

import argparse
import os
import signal
import sys
import threading
from concurrent import futures

import grpc

#: Calls in flight at once: a sync step's parts wait in theirs, a step's transfers come beside.
_THREADS = 128
#: RunGraphRequest.request_id (tensorflow/core/protobuf/worker.proto): field 11, a varint.
_REQUEST_ID = 11
#: No size limit on what passes through (a step's tensors may be large).
#: Seconds left that mean "no deadline" (gRPC Python reports the lack of one as about 9e18 seconds).
_NO_DEADLINE = 1e9
_UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def _varint(buf: bytes, i: int):
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1          # an int64 field's negative values travel as 10 bytes, two's complement
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def request_id(message: bytes, replace=None):
    """The ``request_id`` of a serialized ``RunGraphRequest`` (None if unset); with ``replace``, the message with
    that id instead. The protobuf wire format read by hand: TF's Python wheel has no ``worker_pb2``."""
    i = 0
    while i < len(message):
        start = i
        key, i = _varint(message, i)
        field, kind = key >> 3, key & 7
        if kind == 0:
            value, i = _varint(message, i)
            if field == _REQUEST_ID:
                if replace is None:
                    return value
                return message[:start] + _encode_varint(key) + _encode_varint(replace) + message[i:]
        elif kind == 1:
            i += 8
        elif kind == 2:
            size, i = _varint(message, i)
            i += size
        elif kind == 5:
            i += 4
        else:
            raise ValueError(f"not a protobuf message: wire type {kind} at byte {start}")
    if replace is None:
        return None
    return message + _encode_varint(_REQUEST_ID << 3) + _encode_varint(replace)


class RepeatingRelay(grpc.GenericRpcHandler):
    """Serves on a free port of localhost and forwards every call to ``upstream``; see the module doc.

    ``every``: repeat the id of every ``every``-th RunGraph request (0: only when armed by :meth:`repeat_next`).
    """

    def __init__(self, upstream: str, every: int = 0):
        self.upstream, self.every = upstream, every
        self._channel = grpc.insecure_channel(upstream, options=_UNLIMITED)
        self._lock = threading.Lock()
        self._armed = 0
        self._last_id = None
        self.run_graphs = 0         # RunGraph requests seen
        self.repeated = 0           # of them sent upstream with the id before theirs
        self._server = grpc.server(futures.ThreadPoolExecutor(_THREADS, thread_name_prefix="relay"), options=_UNLIMITED)
        self._server.add_generic_rpc_handlers([self])
        self.port = self._server.add_insecure_port("localhost:0")
        self.address = f"localhost:{self.port}"
        self._server.start()

    def repeat_next(self, count: int = 1):
        """Send the next ``count`` RunGraph requests with the id of the request before each."""
        with self._lock:
            self._armed += count

    def _rewrite(self, request: bytes) -> bytes:
        """The request as it goes upstream: with the id of the one before it where it is to repeat one."""
        with self._lock:
            self.run_graphs += 1
            own = request_id(request)
            repeat = self._last_id is not None and (
                self._armed > 0 or (self.every and self.run_graphs % self.every == 0))
            if repeat:
                self._armed = max(0, self._armed - 1)
                self.repeated += 1
                return request_id(request, self._last_id)
            self._last_id = own
        return request

    def service(self, details):
        method = details.method
        upstream = self._channel.unary_unary(method)    # bytes in, bytes out: no (de)serializer

        def forward(request, context):
            if method.endswith("/RunGraph"):
                request = self._rewrite(request)
            remaining = context.time_remaining()      # ~9e18 when the caller set no deadline
            call = upstream.future(request, metadata=context.invocation_metadata(),
                                   timeout=remaining if remaining < _NO_DEADLINE else None)
            # A call its caller gave up on (a run's timeout cancels a waiting part) is given up upstream too,
            # as without the relay: else the part would wait on there and hold one of the relay's threads.
            context.add_callback(call.cancel)
            try:
                return call.result()
            except grpc.FutureCancelledError:
                context.abort(grpc.StatusCode.CANCELLED, "cancelled by its caller")
            except grpc.RpcError as e:
                context.abort(e.code(), e.details())
        return grpc.unary_unary_rpc_method_handler(forward)

    def close(self):
        """Stop serving (calls in flight are cancelled) and close the upstream channel."""
        self._server.stop(grace=None).wait(10)
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="HOST:PORT of the task's own server")
    p.add_argument("--every", type=int, required=True, help="repeat the id of every N-th RunGraph request")
    p.add_argument("--port-file", required=True, help="where to write the relay's port once it serves")
    p.add_argument("--count-file", required=True, help="where to write, at SIGTERM, 'REPEATED RUNGRAPHS'")
    args = p.parse_args(argv)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with RepeatingRelay(args.upstream, every=args.every) as relay:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(relay.port))
        os.replace(args.port_file + ".tmp", args.port_file)
        while not done.wait(0.2):
            pass
        with open(args.count_file, "w") as f:
            f.write(f"{relay.repeated} {relay.run_graphs}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
