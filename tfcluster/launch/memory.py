"""Per-ps memory limits: each ps task in a memory cgroup of its own, and what the kernel did to it.

``tfcluster local --ps-memory 1500M`` makes one cgroup per ps task below the
launcher's own memory cgroup (``/proc/self/cgroup``), on whichever version is
mounted: cgroup v1's memory hierarchy (``memory.limit_in_bytes``, and
``memory.memsw.limit_in_bytes`` so swap does not stretch the limit) or the v2
unified one (``memory.max``, ``memory.swap.max`` 0). A ps joins its cgroup in
the child before it execs, so all it allocates is charged there. When a ps
dies, :meth:`Cgroup.oom_killed` says whether the kernel killed it for memory,
and :meth:`Cgroup.peak` how much it used at most. docs/memory.md has the rest.
"""

import contextlib
import errno
import json
import logging
import os
import re
import time
from typing import Optional

from ..core.errors import SpecError, TfclusterError
from ..graph.placement import ROWS, human_bytes
from ..topology.cluster import Role

log = logging.getLogger("tfcluster")

#: ``1500M``, ``1.5G``, ``2GiB``, ``800000000``: K, M, G, T are powers of 1024, as for the kernel and Docker.
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(name: str, value) -> Optional[int]:
    """Bytes of ``value`` (an int, or ``1500M``, ``1.5G``); None stays None; else one line naming ``name``."""
    if value is None:
        return None
    m = None if isinstance(value, bool) else _SIZE.fullmatch(str(value).strip())
    size = int(float(m.group(1)) * _UNITS[m.group(2).lower()]) if m else 0
    if size <= 0:
        raise SpecError(f"{{{name}}} must be a size such as 1500M or 1.5G (K, M, G, T: powers of 1024), "
                        f"got {value!r}", params=[name])
    return size


def human(n: Optional[float]) -> str:
    """``1503238553`` -> ``1.4 GB``, as the placement report counts; None -> ``unknown``."""
    return "unknown" if n is None else human_bytes(n)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str):
    with open(path, "w") as f:
        f.write(text)


def _fields(text: str) -> dict:
    """``{"oom_kill": 1, ...}`` from a ``key value`` file (memory.oom_control, memory.events)."""
    pairs = (line.split() for line in text.splitlines())
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}


def _mounts():
    """``[(fstype, super options, mount root, mount point)]`` of this process's mounts."""
    out = []
    for line in _read("/proc/self/mountinfo").splitlines():
        head, _, tail = line.partition(" - ")
        fields, fs = head.split(), tail.split()
        if len(fields) >= 5 and len(fs) >= 3:
            out.append((fs[0], fs[2].split(","), fields[3], fields[4]))
    return out


def own_memory_cgroup():
    """``(version, directory)``: the launcher's own memory cgroup, on v1 where v1 has the controller, else v2."""
    try:
        mounts = _mounts()
        own = [line.split(":", 2) for line in _read("/proc/self/cgroup").splitlines() if line.count(":") >= 2]
    except OSError as e:
        raise TfclusterError(f"{{ps_memory}}: cannot read this process's cgroups: {e.strerror}",
                             params=["ps_memory"]) from None
    v1 = next((path for _, controllers, path in own if "memory" in controllers.split(",")), None)
    v2 = next((path for hid, controllers, path in own if hid == "0" and not controllers), None)
    for version, fstype, path in ((1, "cgroup", v1), (2, "cgroup2", v2)):
        for fs, options, root, mountpoint in mounts:
            if path is None or fs != fstype or (version == 1 and "memory" not in options):
                continue
            # Inside a cgroup namespace or a bind mount, the mount shows the hierarchy from ``root`` down.
            inside = path[len(root):] if root != "/" and path.startswith(root) else path
            directory = mountpoint + inside.rstrip("/")
            if version == 2:
                try:
                    if "memory" not in _read(os.path.join(directory, "cgroup.controllers")).split():
                        break       # a hybrid system whose memory controller is on v1, or nowhere
                except OSError:
                    break
            return version, directory
    raise TfclusterError("{ps_memory}: this system has no memory cgroup controller mounted (v1 or v2)",
                         params=["ps_memory"])


class Cgroup:
    """One ps task's memory cgroup: its directory, its limit, whether the kernel killed in it, its peak."""

    def __init__(self, version: int, path: str, limit: int):
        self.version, self.path, self.limit = version, path, limit
        self.ooms_seen = 0      # OOM kills already reported (a restarted ps keeps its cgroup)
        self.own_peak = None    # the most seen by sample(): the ps's memory without its written files' cache

    def _file(self, v1: str, v2: str) -> str:
        return os.path.join(self.path, v1 if self.version == 1 else v2)

    @property
    def procs(self) -> str:
        """The file a process writes its pid to to join this cgroup (exec_bound.py does, before the task execs)."""
        return os.path.join(self.path, "cgroup.procs")

    def peak(self) -> Optional[int]:
        """The most memory charged here since the cgroup was made (None where the kernel does not say)."""
        try:
            return int(_read(self._file("memory.max_usage_in_bytes", "memory.peak")).strip())
        except (OSError, ValueError):
            return None

    def sample(self):
        """Note the memory charged here now, less the page cache of files no process maps: a ps writes its own
        part of each checkpoint (sharded saves), and those pages count here until the kernel reclaims them,
        which it does before it kills for memory, so they are not memory the ps needs."""
        try:
            usage = int(_read(self._file("memory.usage_in_bytes", "memory.current")).strip())
            stat = _fields(_read(self._file("memory.stat", "memory.stat")))
        except (OSError, ValueError):
            return
        cached = stat.get("active_file", 0) + stat.get("inactive_file", 0)
        cached -= stat.get("mapped_file" if self.version == 1 else "file_mapped", 0)    # libraries stay counted
        self.own_peak = max(self.own_peak or 0, usage - max(cached, 0))

    def own(self) -> Optional[int]:
        """The ps's peak without its written files' page cache (sampled), else the cgroup's peak."""
        return self.own_peak if self.own_peak else self.peak()

    def oom_killed(self, returncode: Optional[int]) -> bool:
        """True when the kernel's OOM killer struck here since the last call (a process that died by SIGKILL)."""
        try:
            if self.version == 2:
                count = _fields(_read(self._file("", "memory.events"))).get("oom_kill", 0)
            else:
                count = _fields(_read(self._file("memory.oom_control", ""))).get("oom_kill")
                if count is None:   # kernels before 4.13: the limit was hit, and something died by SIGKILL
                    failed = int(_read(self._file("memory.failcnt", "")).strip())
                    count = int(failed > 0 and returncode == -9)
        except (OSError, ValueError):
            return False
        new, self.ooms_seen = count > self.ooms_seen, max(count, self.ooms_seen)
        return new


class MemoryLimits:
    """The memory cgroups of one run's ps tasks: made below the launcher's own, all removed by :meth:`remove`."""

    def __init__(self, limit: int, tasks):
        self.limit = limit
        self.cgroups = {}           # task name -> Cgroup
        self.state_record = None    # see place()
        self._moved_from = None     # v2: the cgroup the launcher left to let its children have memory
        self.version, self.own = own_memory_cgroup()
        try:
            if self.version == 2:
                self._delegate_v2()
            for name in tasks:
                self._make(name)
        except OSError as e:
            self.remove()
            why = {errno.EACCES: "permission denied: it needs root (or a cgroup delegated to this user)",
                   errno.EPERM: "not permitted: it needs root (or a cgroup delegated to this user)",
                   errno.EROFS: "read-only file system"}.get(e.errno, e.strerror)
            raise TfclusterError(f"{{ps_memory}}: cannot set a memory limit in {e.filename or self.own}: {why}",
                                 params=["ps_memory"]) from None

    def _make(self, name: str):
        path = os.path.join(self.own, f"tfcluster-{os.getpid()}-{name.replace(':', '-')}")
        os.mkdir(path)
        self.cgroups[name] = Cgroup(self.version, path, self.limit)    # made: remove() removes it whatever fails next
        if self.version == 1:
            _write(os.path.join(path, "memory.limit_in_bytes"), str(self.limit))
            memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
            if os.path.exists(memsw):       # swap accounting on: swap counts toward the same limit
                _write(memsw, str(self.limit))
        else:
            _write(os.path.join(path, "memory.max"), str(self.limit))
            if os.path.exists(os.path.join(path, "memory.swap.max")):
                _write(os.path.join(path, "memory.swap.max"), "0")

    def _delegate_v2(self):
        """Enable the memory controller for the launcher's children (v2: only in a cgroup without processes)."""
        control = os.path.join(self.own, "cgroup.subtree_control")
        if "memory" in _read(control).split():
            return
        try:
            _write(control, "+memory")
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
        # The own cgroup has processes. When the launcher is the only one, it moves into a leaf of its own.
        procs = _read(os.path.join(self.own, "cgroup.procs")).split()
        if procs != [str(os.getpid())]:
            raise TfclusterError(f"{{ps_memory}}: cannot enable the memory controller in {self.own}: other "
                                 "processes share that cgroup (cgroup v2 allows controllers only below cgroups "
                                 "without processes); run tfcluster in a cgroup of its own (systemd-run --scope)",
                                 params=["ps_memory"])
        leaf = os.path.join(self.own, f"tfcluster-{os.getpid()}-launcher")
        os.mkdir(leaf)
        self._moved_from = self.own
        _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
        _write(control, "+memory")

    def sample(self):
        """Sample every ps's memory (:meth:`Cgroup.sample`); the supervisor calls it as it polls."""
        for cg in self.cgroups.values():
            cg.sample()

    def peaks_line(self) -> str:
        """``ps memory: ps:0 peak 620.6 MB (800.0 MB with its checkpoint files' page cache), ...; limit 800.0 MB
        each (--ps-memory, cgroup v1)``."""
        def peak(cg):
            own, charged = cg.own(), cg.peak()
            cached = f" ({human(charged)} with its checkpoint files' page cache)" \
                if own is not None and charged is not None and charged - own > 1 << 20 else ""
            return f"peak {human(own)}{cached}"
        peaks = ", ".join(f"{name} {peak(cg)}" for name, cg in self.cgroups.items())
        return f"ps memory: {peaks}; limit {human(self.limit)} each (--ps-memory, cgroup v{self.version})"

    def place(self, procs, state_record: str):
        """Give each ps TaskProcess its cgroup, joined when it starts (and restarts); ``state_record``: the file
        in which the chief notes the bytes it placed on each ps (graph/placement.py's record_ps_state)."""
        self.state_record = state_record
        for p in procs:
            p.cgroup = self.cgroups.get(p.name, p.cgroup)

    def killed(self, name: str, returncode: int) -> Optional[str]:
        """Why ps ``name`` died when the kernel killed it for memory, in words (its limit and peak, the state each
        ps held); None for any other death."""
        cg = self.cgroups.get(name)
        if cg is None or not cg.oom_killed(returncode):
            return None
        return (f"was killed out of memory: its --ps-memory limit is {human(self.limit)} (peak "
                f"{human(cg.peak())}); state held: {_state(self.state_record)}")

    def remove(self):
        """Remove every cgroup made (their processes are gone by now), and put the launcher back where it was."""
        for cg in list(self.cgroups.values()):
            _rmdir(cg.path)
        if self._moved_from is not None:
            own, self._moved_from = self._moved_from, None
            try:
                _write(os.path.join(own, "cgroup.subtree_control"), "-memory")
                _write(os.path.join(own, "cgroup.procs"), str(os.getpid()))
            except OSError as e:
                log.debug("could not move the launcher back to %s: %s", own, e.strerror)
            _rmdir(os.path.join(own, f"tfcluster-{os.getpid()}-launcher"))


@contextlib.contextmanager
def ps_memory_limits(limit: Optional[int], tasks):
    """``with ps_memory_limits(bytes, tasks) as limits``: the ps tasks' cgroups for the run (None: no limit), then
    one line of peaks, and every cgroup removed, whatever ends the run."""
    if limit is None:
        yield None
        return
    limits = MemoryLimits(limit, [str(t) for t in tasks if t.role is Role.PS])
    ended = False
    try:
        yield limits
        ended = True        # a run that ran; a one-line refusal raised before any task gets no peaks line
    finally:
        if ended:
            log.info("%s", limits.peaks_line())
        limits.remove()


def _state(path: Optional[str]) -> str:
    """``ps:0 702.0 MB, ps:1 ...`` from the chief's record (graph/placement.py), with the embedding-variable rows
    each ps held at the chief's last count, or why it is not known."""
    try:
        with open(path) as f:
            state = json.load(f)
        counted = state.pop(ROWS, None) or {}
        rows = counted.get("rows", {})
        held = ", ".join(f"{name} {human(n)}" + (f" and {rows[name]:,} embedding-variable rows" if name in rows else "")
                         for name, n in state.items()) or "nothing on the ps tasks"
        return held + (f" (rows at global step {counted['global_step']})" if rows else "")
    except (OSError, ValueError, TypeError, AttributeError):
        return ("unknown (no placement record: the program is not tfcluster.fit, an Estimator or a TF1-mode "
                "program, or its chief had not built its graph yet)")


def _rmdir(path: str):
    """Remove a cgroup; a moment's retry while the kernel finishes with a process that just died."""
    for attempt in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or attempt == 49:
                log.warning("could not remove memory cgroup %s: %s", path, e.strerror)
                return
            time.sleep(0.1)
