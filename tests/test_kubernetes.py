"""Kubernetes, as Kubeflow's TFJob runs tfcluster: examples/kubernetes/digits-tfjob.json, pod by pod.

The fast tests read the manifest and give each replica the TF_CONFIG the training operator would
(tests/pods.py): every replica finds its role, and ``tfcluster start`` calls a service name private.
The slow ones run the manifest's own commands as real processes on network-namespace test hosts
whose names resolve like the pods' services, the worker's pod killed and created again at a new
address under the same name, as the operator does under ``restartPolicy: ExitCode``.
"""

import copy
import json
import os
import re
import sys
import time

import pytest

from conftest import REPO, base_env, kill_tree, no_process_left, run_cli
from jobs.stream import Stream
from netns import unavailable_reason
from pods import Pods, container, local_argv, read_tfjob, replica_port, tfjob_replicas
from tfcluster.topology.cluster import Cluster, Task

MANIFEST = os.path.join(REPO, "examples", "kubernetes", "digits-tfjob.json")
FIRST_STEP = r"(\w+:\d+) first step done .* global step (\d+)"
EXPOSED = "is not a loopback or private address"


def manifest_items() -> dict:
    with open(MANIFEST, encoding="utf-8") as f:
        doc = json.load(f)
    return {item["kind"]: item for item in doc["items"]}


# ------------------------------------------------------------------ the manifest, read
def test_the_manifest_holds_a_tfjob_its_claim_and_a_network_policy_that_fences_its_port():
    items = manifest_items()
    assert sorted(items) == ["NetworkPolicy", "PersistentVolumeClaim", "TFJob"]
    tfjob = items["TFJob"]
    assert tfjob["apiVersion"] == "kubeflow.org/v1"
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert sorted(specs) == ["Chief", "Evaluator", "PS", "Worker"]
    claim = items["PersistentVolumeClaim"]["metadata"]["name"]
    for rtype, spec in specs.items():
        c = container(spec)       # the operator gives TF_CONFIG to the container named tensorflow only
        assert c["image"] and c["command"][:2] == ["tfcluster", "start"], rtype
        # Pods created again under ExitCode after a signal (128-255); a bad input (exit 2) fails the job.
        assert spec["restartPolicy"] == "ExitCode", rtype
        if rtype != "PS":         # the checkpoints are shared: the chief writes, the evaluator reads
            volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
            mount = c["volumeMounts"][0]
            assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == claim
            assert c["args"][c["args"].index("--checkpoint-dir") + 1].startswith(mount["mountPath"] + "/")
    policy = items["NetworkPolicy"]["spec"]
    job = {"training.kubeflow.org/job-name": tfjob["metadata"]["name"]}
    assert policy["podSelector"]["matchLabels"] == job
    assert policy["ingress"] == [{"from": [{"podSelector": {"matchLabels": job}}],
                                  "ports": [{"protocol": "TCP", "port": replica_port(specs["PS"])}]}]


def test_every_replica_of_the_manifest_reads_the_tf_config_the_operator_gives_it():
    tfjob = read_tfjob(MANIFEST)
    replicas = {r.pod: r for r in tfjob_replicas(tfjob)}
    assert sorted(replicas) == ["digits-chief-0", "digits-evaluator-0", "digits-ps-0", "digits-worker-0"]
    assert json.loads(replicas["digits-worker-0"].tf_config) == {
        "cluster": {"chief": ["digits-chief-0.default.svc:2222"],
                    "evaluator": ["digits-evaluator-0.default.svc:2222"],
                    "ps": ["digits-ps-0.default.svc:2222"], "worker": ["digits-worker-0.default.svc:2222"]},
        "task": {"type": "worker", "index": 0}, "environment": "cloud"}
    roles = {}
    for pod, r in replicas.items():
        c = Cluster.from_tf_config({"TF_CONFIG": r.tf_config})
        assert "evaluator" not in c.jobs and [str(t) for t in c.trainers()] == ["chief:0", "worker:0"], pod
        roles[pod] = (c.role(), c.is_chief if c.role() != "evaluator" else None, c.needed_tasks())
    assert roles == {"digits-chief-0": ("chief", True, [Task("ps", 0)]),
                     "digits-worker-0": ("worker", False, [Task("ps", 0)]),
                     "digits-ps-0": ("ps", False, []), "digits-evaluator-0": ("evaluator", None, [])}


@pytest.mark.parametrize("host, kubernetes", [
    ("digits-ps-0.default.svc", True),
    ("digits-ps-0.default.svc.cluster.local", True),
    ("digits-ps-0", False),                    # a bare name: private, as before, with no Kubernetes advice
    ("10.8.0.12", False),
])
def test_start_calls_a_pods_service_name_private_and_says_how_to_fence_it(host, kubernetes):
    # A ps running a command needs no TensorFlow and resolves nothing: the line is start's own.
    tf_config = json.dumps({"cluster": {"ps": [f"{host}:2222"], "worker": ["digits-worker-0.default.svc:2222"]},
                            "task": {"type": "ps", "index": 0}, "environment": "cloud"})
    r = run_cli("start", "--", sys.executable, "-c", "pass", env=base_env(TF_CONFIG=tf_config))
    assert r.returncode == 0, r.stderr
    assert EXPOSED not in r.stderr
    assert f"ps:0's server listens on port 2222 of every interface, not only {host}" in r.stderr
    assert ("a NetworkPolicy that admits only this job's pods" in r.stderr) == kubernetes


@pytest.mark.parametrize("host", ["ps.example.com", "digits-ps-0.default.svc.example.com", "8.8.8.8"])
def test_start_still_warns_for_a_public_name_or_address(host):
    tf_config = json.dumps({"cluster": {"ps": [f"{host}:2222"], "worker": ["w:2222"]},
                            "task": {"type": "ps", "index": 0}})
    r = run_cli("start", "--", sys.executable, "-c", "pass", env=base_env(TF_CONFIG=tf_config))
    assert r.returncode == 0 and f"ps:0 at {host}:2222 {EXPOSED}" in r.stderr, r.stderr


# ------------------------------------------------------------------ the TFJob, on pods
_why = unavailable_reason()


def on_pods(test):
    """A test that runs pods on namespaced test hosts: slow, and skipped only where none can be made."""
    for mark in (pytest.mark.netns, pytest.mark.slow,
                 pytest.mark.skipif(_why is not None, reason=f"no test hosts: {_why}")):
        test = mark(test)
    return test


class TFJobRun:
    """The manifest's replicas as processes on :class:`pods.Pods`, each pod's output a Stream."""

    def __init__(self, tfjob, pods, procs, tmp_path, steps):
        self.pods, self.procs = pods, procs
        self.replicas = {r.pod: r for r in tfjob_replicas(tfjob)}
        self.runs = tmp_path / "runs"            # the claim every pod mounts at /runs
        self.runs.mkdir()
        self.steps = steps
        self.streams, self.started, self.gone = {}, {}, []

    def start(self, pod):
        """Run the pod's container command in the pod, with the TF_CONFIG the operator gives it."""
        r = self.replicas[pod]
        argv = local_argv(r.container, {"/runs": self.runs},
                          {"--steps": self.steps} if "--steps" in r.container.get("args", []) else {})
        # workingDir /app is the image's copy of this repository (examples/kubernetes/Dockerfile).
        proc = self.procs.start(self.pods.exec_prefix(pod) + argv, env=base_env(TF_CONFIG=r.tf_config), cwd=REPO)
        self.started[pod] = time.monotonic()
        self.streams[pod] = Stream(proc, pod)
        return self.streams[pod]

    def lose(self, pod) -> Stream:
        """The pod's node is lost: SIGKILL to everything in it (exit 137, retryable under ExitCode)."""
        lost = self.streams.pop(pod)
        kill_tree(lost.proc.pid)       # (it reaps them too: the exit code reads 0)
        lost.finish(timeout=10)
        assert " done: global step" not in lost.text, f"{pod} ended before it was killed:\n{lost.tail()}"
        self.gone.append(lost)
        return lost

    def wait_for(self, pod, pattern, timeout):
        """``(time, match)`` of the pod's first line matching ``pattern``; failing, every pod's last lines."""
        try:
            return self.streams[pod].wait_for(pattern, timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}\n\n{self.tails()}") from None

    def tails(self) -> str:
        return "\n\n".join(f"--- {p}:\n{s.tail(25)}" for p, s in self.streams.items())

    def finish(self, timeout) -> dict:
        """Every pod's exit code (all 0, or the failure shows each pod's last lines), and the done marker."""
        codes = {pod: s.finish(timeout=timeout) for pod, s in self.streams.items()}
        assert set(codes.values()) == {0}, f"exit codes {codes}\n\n{self.tails()}"
        assert no_process_left([s.proc.pid for s in self.streams.values()] + [s.proc.pid for s in self.gone])
        with open(self.runs / "digits" / "tfcluster_done.json", encoding="utf-8") as f:
            return json.load(f)

    def text(self, pod) -> str:
        return self.streams[pod].text

    def logs(self) -> str:
        return "\n".join(s.text for s in self.streams.values())


def local_steps(text: str, task: str) -> int:
    """The steps a trainer ran, from examples/digits.py's last line (``chief:0: 300 steps, ...``)."""
    return int(re.search(rf"^{task}: (\d+) steps, ", text, re.M).group(1))


@on_pods
@pytest.mark.timeout(300)
def test_the_tfjob_trains_on_pods_and_a_worker_created_again_at_a_new_address_rejoins(procs, tmp_path,
                                                                                     reliability):
    steps, worker = 300, "digits-worker-0"
    tfjob = read_tfjob(MANIFEST)
    with Pods([r.pod for r in tfjob_replicas(tfjob)]) as pods:
        run = TFJobRun(tfjob, pods, procs, tmp_path, steps)
        for pod in run.replicas:
            run.start(pod)
        run.wait_for(worker, FIRST_STEP, 150)
        time.sleep(1.0)           # mid-run: a sync step takes some 20 ms here
        # The worker's node is lost; the operator creates its pod again, on another host, at another
        # address, under the same service name, with the same TF_CONFIG.
        old_address = pods.address(worker)
        lost = run.lose(worker)
        new_address = pods.move(worker)
        again = run.start(worker)
        t_first, m = run.wait_for(worker, FIRST_STEP, 150)
        done = run.finish(timeout=180)
    logs = run.logs()
    # In sync mode the chief cannot step without the worker: the run reached its target through the pod
    # created again. Had anything rolled back (the ps lost, a checkpoint restored), the chief would have
    # run the lost steps again: it ran exactly the target.
    redone = local_steps(run.text("digits-chief-0"), "chief:0") - steps
    stale = again.matches(rf"worker:0 lost its session .*{re.escape(old_address)}:2222")
    reliability("seconds from the new worker pod's start to its first step", t_first - run.started[worker], "s")
    reliability("sessions it recreated while the ps still dialled its old address", len(stale), "")
    reliability("global steps lost when the worker's pod was created again", redone, "steps")
    assert new_address != old_address and "first step done" in lost.text
    assert done["global_step"] == steps and redone == 0 and int(m.group(2)) > 1
    assert re.search(rf"evaluator:0: final test accuracy 0\.\d+ at step {steps}", logs), logs[-3000:]
    assert re.search(rf"test accuracy 0\.\d+ \(loss [\d.]+, step {steps}, checkpoint in ", logs), logs[-3000:]
    assert "every trainer is done" in run.text("digits-ps-0")
    # Service names are private names: each task gets the note on its open port, not the warning.
    assert EXPOSED not in logs
    assert "not only digits-worker-0.default.svc, with no authentication" in again.text


@on_pods
@pytest.mark.timeout(240)
def test_the_tfjob_written_with_a_master_trains_with_the_master_as_its_chief(procs, tmp_path):
    # TFJobs of the TF 1.x era name the chief Master: the operator writes "master" in TF_CONFIG.
    steps = 60
    tfjob = copy.deepcopy(read_tfjob(MANIFEST))
    specs = tfjob["spec"]["tfReplicaSpecs"]
    specs["Master"] = specs.pop("Chief")
    del specs["Evaluator"]
    with Pods([r.pod for r in tfjob_replicas(tfjob)]) as pods:
        run = TFJobRun(tfjob, pods, procs, tmp_path, steps)
        for pod in run.replicas:
            run.start(pod)
        done = run.finish(timeout=180)
    master = run.text("digits-master-0")
    assert json.loads(run.replicas["digits-master-0"].tf_config)["task"] == {"type": "master", "index": 0}
    # The master initialised, checkpointed and evaluated; both trainers took every sync step; the ps
    # counted the master among the trainers it waits for, and exited.
    assert "master:0 initialised the model" in master and "master:0 saved checkpoint" in master
    assert re.search(rf"test accuracy 0\.\d+ \(loss [\d.]+, step {steps}, ", master), master[-2000:]
    assert "worker:0 found the model ready" in run.text("digits-worker-0")
    assert local_steps(master, "master:0") == local_steps(run.text("digits-worker-0"), "worker:0") == steps
    assert "master:0 is done" in run.text("digits-ps-0") and "every trainer is done" in run.text("digits-ps-0")
    assert done["global_step"] == steps
