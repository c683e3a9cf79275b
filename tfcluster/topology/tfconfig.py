"""TF_CONFIG as schedulers write it, read into a cluster's jobs and this process's task.

Kubeflow's training operator (kubeflow/training-operator, ``pkg/controller.v1/tensorflow/
tensorflow.go``, ``genTFConfigJSONStr``) gives replica ``i`` of each replica type, lowercased::

    {"cluster": {"chief": [...], "worker": [...], "ps": [...], "evaluator": [...]},
     "task": {"type": "worker", "index": 1}, "environment": "cloud"}

every address a headless service's name, ``<tfjob>-<type>-<i>.<namespace>.svc:<port>`` (with
``.<domain>`` after ``svc`` when the operator has ``CUSTOM_CLUSTER_DOMAIN``). Here:

- ``master`` is TF 1.x's name for the chief (:data:`tfcluster.topology.cluster.ROLES`);
- an ``evaluator`` listed in the cluster is set aside: no session, ps or trainer counts it or waits for
  it, as TF's distribute coordinator splits it off (``_split_cluster_for_evaluator``); the task of type
  ``evaluator`` still evaluates, outside the cluster;
- ``environment`` is accepted and ignored: TF 2.21 acts only on ``"google"`` (its distribute
  coordinator then starts no server of its own), and the operator's ``"cloud"`` was for
  ``tf.contrib.learn`` 1.3 and older (the operator's own comment); tfcluster always starts its server;
- ``rpc_layer`` may only be ``grpc``: TF 2.21's servers speak nothing else;
- with ``enableDynamicWorker`` the operator writes a *sparse* cluster, TF's form of a job as an object
  ``{index: address}`` that lists only the tasks a process talks to: the ps sees itself, a worker the ps
  and itself, the chief and the evaluator nothing (``convertClusterSpecToSparseClusterSpec``; operator
  1.6 and older put it under ``"sparseCluster"``, 1.7 on under ``"cluster"``, kubeflow/training-operator
  #1798). That is part of a cluster whose size even the operator changes at will, and tfcluster needs
  all of it (a ps exits once every trainer is done; sync steps and data shards count the trainers), so
  it is refused in one line that names what the task was told and what to do. TF itself never reads
  ``sparseCluster``; beside a full ``cluster`` it is checked against it and otherwise ignored.

This module knows nothing of :class:`~tfcluster.topology.cluster.Cluster`: it returns plain jobs, which the
cluster validates, as :mod:`tfcluster.topology.slurm` does for Slurm.
"""

import json
import logging
from dataclasses import dataclass
from typing import Optional

from ..core.errors import SpecError

log = logging.getLogger("tfcluster")

#: The keys a TF_CONFIG may have: TF's (``cluster``, ``task``, ``environment``, ``rpc_layer``) and the
#: training operator's ``sparseCluster``.
KEYS = ("cluster", "task", "environment", "rpc_layer", "sparseCluster")
#: Keys other writers add that TF ignores, and so does tfcluster, without a word: Vertex AI's ``job``.
FOREIGN_KEYS = ("job",)
_DYNAMIC = "in a TFJob, set enableDynamicWorker to false"
_NEEDS_ALL = ("tfcluster needs every task's address (a ps exits once every trainer is done; sync steps and data "
              "shards count the trainers)")


@dataclass(frozen=True)
class Layout:
    """What a TF_CONFIG or cluster file says: the jobs, this process's task, and what was set aside."""

    #: job -> its addresses as given, the evaluator taken out.
    jobs: dict
    #: ``(type, index)`` of this process, or None.
    task: Optional[tuple] = None
    #: the evaluator's address(es) as listed in the cluster (at most one): kept out of every session's view.
    evaluator: tuple = ()
    #: the ``environment`` value, for the record (nothing acts on it).
    environment: Optional[str] = None


def read_layout(data, where: str = "cluster spec") -> Layout:
    """The layout of a TF_CONFIG-shaped dict, or of a bare ``{job: addresses}`` dict (a cluster file)."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if "cluster" not in data and "sparseCluster" not in data:
        jobs, evaluator = _set_evaluator_aside(data, where)
        return Layout(jobs, None, evaluator)
    unknown = set(data) - set(KEYS) - set(FOREIGN_KEYS)
    if unknown:
        # TF ignores keys it does not know; a typo ("tasks") then shows as a missing task, so say which.
        log.warning("%s: ignoring unknown key(s) %s beside 'cluster' (it knows %s)", where,
                    ", ".join(sorted(unknown)), ", ".join(KEYS))
    environment = data.get("environment")
    if environment is not None and not isinstance(environment, str):
        raise SpecError(f"{where}: 'environment' must be a string such as \"cloud\", got {environment!r}")
    rpc = data.get("rpc_layer")
    if rpc not in (None, "", "grpc"):
        raise SpecError(f"{where}: rpc_layer {rpc!r} is not supported: TensorFlow 2.21's servers speak grpc only")
    task = _task(data.get("task"), where)
    if "cluster" not in data:
        raise _partial(data["sparseCluster"], task, where,
                       "'sparseCluster' (TFJob's enableDynamicWorker) is a part of the cluster, not all of it")
    jobs = data["cluster"]
    if isinstance(jobs, dict):
        for job, tasks in jobs.items():
            if isinstance(tasks, dict):
                raise _partial(jobs, task, where, f"job {job!r} is an object {{index: address}}, TF's sparse form, "
                               "which need not list every task (TFJob's enableDynamicWorker writes it)")
        if "sparseCluster" in data:
            _check_agrees(data["sparseCluster"], jobs, where)
    jobs, evaluator = _set_evaluator_aside(jobs, where)
    return Layout(jobs, task, evaluator, environment)


def names_a_cluster(text: str) -> bool:
    """False for a TF_CONFIG that names no cluster (empty, or a task alone): TF 1.x ran that as one process.

    Text that is not JSON names one, so that reading it says what is wrong.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return True
    return not isinstance(data, dict) or bool(data.get("cluster") or data.get("sparseCluster"))


def _task(task, where: str) -> Optional[tuple]:
    if task is None:
        return None
    if not isinstance(task, dict) or "type" not in task:
        raise SpecError(f"{where}: 'task' must be an object like {{\"type\": \"worker\", \"index\": 0}}")
    return task["type"], task.get("index", 0)


def _set_evaluator_aside(jobs, where: str):
    """``(jobs without the evaluator, its addresses)``: listed or not, it is outside the cluster."""
    if not isinstance(jobs, dict) or "evaluator" not in jobs:
        return jobs, ()
    listed = jobs["evaluator"]
    if isinstance(listed, str):
        listed = [a for a in (p.strip() for p in listed.split(",")) if a]
    if not isinstance(listed, (list, tuple)) or not listed:
        raise SpecError(f"{where}: job 'evaluator' must list one 'host:port', got {jobs['evaluator']!r}")
    if len(listed) > 1:
        raise SpecError(f"{where}: the cluster lists {len(listed)} evaluators; tfcluster runs one, task "
                        "evaluator:0 (in a TFJob, Evaluator replicas: 1)")
    return {j: a for j, a in jobs.items() if j != "evaluator"}, tuple(listed)


def _partial(cluster, task, where: str, what: str) -> SpecError:
    """The one line that refuses a sparse cluster: what it is, what this task was told, and what to do."""
    who = f"{task[0]}:{task[1]}" if task else "this task"
    told = json.dumps(cluster, separators=(",", ":"), default=str)
    return SpecError(f"{where}: {what}; {who} is told only {told}; {_NEEDS_ALL}: give every job as a list of "
                     f"all its tasks' addresses ({_DYNAMIC})")


def _check_agrees(sparse, cluster, where: str):
    """A ``sparseCluster`` beside a full ``cluster`` must name each task at the same address."""
    if not isinstance(sparse, dict):
        raise SpecError(f"{where}: 'sparseCluster' must be an object of job -> addresses, got {type(sparse).__name__}")
    for job, tasks in sparse.items():
        if not isinstance(tasks, (dict, list, tuple)):
            raise SpecError(f"{where}: 'sparseCluster' job {job!r}: expected a list or an object of addresses, "
                            f"got {type(tasks).__name__}")
        for index, address in (tasks.items() if isinstance(tasks, dict) else enumerate(tasks)):
            if not str(index).isdigit():
                raise SpecError(f"{where}: 'sparseCluster' job {job!r}: task index {index!r} is not a whole number")
            full = cluster.get(job)
            given = full[int(index)] if isinstance(full, (list, tuple)) and int(index) < len(full) else None
            if given != address:
                raise SpecError(f"{where}: 'sparseCluster' has {job}:{index} at {address!r}, but 'cluster' "
                                + (f"has it at {given!r}" if given is not None else "does not list it"))
