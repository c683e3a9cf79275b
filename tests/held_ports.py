"""Free ports a test holds until its servers bind them, as ``tfcluster local`` holds its tasks' ports.

Between picking a free port and a child's TensorFlow server binding it pass
seconds (the child imports TensorFlow first). A port let go in between can be
taken: by another test's server on the other xdist worker, or as the local
port of any gRPC client's connection. :class:`HeldPorts` keeps each port bound
(not listening, ``SO_REUSEPORT``; tfcluster/topology/ports.py) and lets go of
it once something answers on it; a child binds beside the hold when its
environment has :data:`REUSE` (``TF_GRPC_REUSE_PORT=1``). A port nothing ever
serves (the ps a test leaves out on purpose) stays held until the test ends,
so it stays a port where nothing answers. Ports handed to ``tfcluster local``
may be held too: the launcher holds them beside the test (``SO_REUSEPORT``).
Slurm's daemons bind theirs without ``SO_REUSEPORT``, so tests/slurmhost.py
picks them free and holds nothing; ports written only into malformed specs
(tests/test_bad_input.py) are never bound.
"""

import threading

from tfcluster.tf2.servers import answers
from tfcluster.topology.ports import REUSE_ENV, PortReservation

#: What a child binding a held port needs in its environment.
REUSE = dict(REUSE_ENV)

#: How often the watcher asks whether a held port answers.
POLL_SECS = 0.05


class HeldPorts:
    """``held(n)``: n distinct free ports, each held until a server answers on it or :meth:`release`."""

    def __init__(self):
        self._held = {}                 # port -> its PortReservation
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = None

    def __call__(self, count: int) -> list:
        # One reservation a port, so each is let go on its own; held ones are never handed out again.
        holds = [PortReservation(1) for _ in range(count)]
        with self._lock:
            self._held.update({h.ports[0]: h for h in holds})
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="held-ports", daemon=True)
            self._watcher.start()
        return [h.ports[0] for h in holds]

    @property
    def held(self) -> list:
        """The ports still held (nothing answered on them yet)."""
        with self._lock:
            return sorted(self._held)

    def _watch(self):
        while not self._stop.wait(POLL_SECS):
            for port in self.held:
                if answers(f"localhost:{port}", timeout=0.5):
                    with self._lock:
                        hold = self._held.pop(port, None)
                    if hold is not None:
                        hold.release()

    def release(self):
        """Let go of every port still held and stop watching (a test's teardown)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        with self._lock:
            holds, self._held = list(self._held.values()), {}
        for hold in holds:
            hold.release()
