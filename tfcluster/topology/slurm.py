"""Slurm's view of a job step: its compressed host lists, tasks per node, and each task's place.

The conventions are TF's SlurmClusterResolver's: tasks are numbered across the
step's nodes in order; a node running k tasks gives them ports
``port_base .. port_base+k-1``; the first ``ps`` tasks are parameter servers,
the rest workers; ``SLURM_PROCID`` picks this process's task.
"""

import itertools
import re
from typing import Mapping

from ..core.errors import SpecError


def slurm_layout(env: Mapping, ps: int = 0, port_base: int = 8888):
    """``(jobs, task)`` of this Slurm step: ``{"worker": [...], "ps": [...]}`` and ``(job, index)``."""
    def need(*names):
        for n in names:
            if env.get(n):
                return env[n]
        raise SpecError(f"Slurm: {names[0]} is not set; run under srun, or pass --cluster")

    hosts = expand_hostlist(need("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"))
    per_node = expand_tasks_per_node(need("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"), len(hosts))
    addrs = [f"{h}:{port_base + k}" for h, n in zip(hosts, per_node) for k in range(n)]
    rank_text = need("SLURM_PROCID")
    if not rank_text.isdigit():
        raise SpecError(f"Slurm: SLURM_PROCID={rank_text!r} is not a whole number")
    rank = int(rank_text)
    if isinstance(ps, bool) or not isinstance(ps, int) or ps < 0:
        raise SpecError(f"Slurm: the number of ps tasks must be a whole number >= 0, got {ps!r}")
    if ps >= len(addrs):
        raise SpecError(f"Slurm: {ps} ps task(s) leave no worker among {len(addrs)} task(s)")
    if rank >= len(addrs):
        raise SpecError(f"Slurm: SLURM_PROCID={rank} is out of range for {len(addrs)} task(s)")
    jobs = {"worker": addrs[ps:]}
    if ps:
        jobs["ps"] = addrs[:ps]
    task = ("ps", rank) if rank < ps else ("worker", rank - ps)
    return jobs, task


def _split_top_level(text: str) -> list:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _expand_range_set(body: str, where: str) -> list:
    out = []
    for part in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            raise SpecError(f"Slurm: bad range {part!r} in host list {where!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise SpecError(f"Slurm: descending range {part!r} in host list {where!r}")
        width = len(lo)
        out += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return out


def expand_hostlist(text: str) -> list:
    """Expand a Slurm compressed host list, e.g. ``node[1-3,5],gpu01``."""
    hosts = []
    for item in _split_top_level(text):
        pieces = re.split(r"(\[[^\]]*\])", item)
        if item.count("[") != item.count("]"):
            raise SpecError(f"Slurm: unbalanced brackets in host list {text!r}")
        choices = [_expand_range_set(p[1:-1], text) if p.startswith("[") else [p] for p in pieces if p]
        hosts += ["".join(c) for c in itertools.product(*choices)]
    if not hosts:
        raise SpecError(f"Slurm: empty host list {text!r}")
    return hosts


def expand_tasks_per_node(text: str, nodes: int) -> list:
    """Expand Slurm's tasks-per-node text, e.g. ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise SpecError(f"Slurm: bad tasks-per-node entry {part!r} in {text!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if len(counts) != nodes:
        raise SpecError(f"Slurm: tasks per node {text!r} covers {len(counts)} node(s), the host list has {nodes}")
    return counts
