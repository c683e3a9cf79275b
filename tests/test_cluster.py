"""The cluster description: every source it is built from, every render, every refusal.

Unit tests: no TensorFlow process is started. Only the two tests that render to
TensorFlow objects import TensorFlow.
"""

import dataclasses
import json

import pytest

from tfcluster import Role
from tfcluster.topology.cluster import Cluster, LegacyFlags, Task, parse_address
from tfcluster.topology.slurm import expand_hostlist, expand_tasks_per_node
from tfcluster.core.errors import SpecError, TfclusterError
from tfcluster.topology.ports import port_is_free

JOBS = {"worker": ["localhost:2223", "localhost:2224"], "ps": ["localhost:2222"]}


def slurm_env(nodes, tasks_per_node, procid, **extra):
    env = {"SLURM_STEP_NODELIST": nodes, "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
           "SLURM_PROCID": str(procid)}
    env.update(extra)
    return env


# ------------------------------------------------------------------ sources
def test_a_bare_cluster_json_gives_the_jobs_in_chief_worker_ps_order_and_no_task():
    c = Cluster.from_json(json.dumps({"ps": ["h0:1"], "worker": ["h1:2"], "chief": ["h2:3"]}))
    assert list(c.jobs) == ["chief", "worker", "ps"]
    assert c.as_dict() == {"chief": ["h2:3"], "worker": ["h1:2"], "ps": ["h0:1"]}
    assert c.task is None


def test_a_tf_config_shaped_json_gives_the_jobs_and_this_task():
    c = Cluster.from_json(json.dumps({"cluster": JOBS, "task": {"type": "worker", "index": 1},
                                      "environment": "cloud"}))
    assert c.as_dict() == JOBS
    assert c.task == Task("worker", 1)
    assert c.address(c.task) == "localhost:2224"


def test_a_task_without_an_index_is_task_0():
    c = Cluster.from_json(json.dumps({"cluster": JOBS, "task": {"type": "ps"}}))
    assert c.task == Task("ps", 0)


def test_a_cluster_file_in_either_shape_is_read(tmp_path):
    bare, shaped = tmp_path / "bare.json", tmp_path / "shaped.json"
    bare.write_text(json.dumps(JOBS))
    shaped.write_text(json.dumps({"cluster": JOBS, "task": {"type": "ps", "index": 0}}))
    assert Cluster.from_file(str(bare)).as_dict() == JOBS
    assert Cluster.from_file(str(shaped)).task == Task("ps", 0)


def test_tf_config_is_read_from_the_given_environment():
    env = {"TF_CONFIG": json.dumps({"cluster": JOBS, "task": {"type": "worker", "index": 0}})}
    c = Cluster.from_tf_config(env)
    assert c.as_dict() == JOBS and c.task == Task("worker", 0)
    assert c.is_chief and c.num_replicas == 2


def test_an_evaluator_task_is_allowed_beside_the_cluster_and_waits_for_nobody():
    env = {"TF_CONFIG": json.dumps({"cluster": JOBS, "task": {"type": "evaluator", "index": 0}})}
    c = Cluster.from_tf_config(env)
    assert c.task == Task("evaluator", 0)
    assert "evaluator" not in c.jobs
    assert c.needed_tasks() == []


@pytest.mark.parametrize("ps, worker", [
    ("localhost:2222", "localhost:2223,localhost:2224"),
    (["localhost:2222"], ["localhost:2223", "localhost:2224"]),
    (" localhost:2222 ", "localhost:2223, localhost:2224,"),
])
def test_host_lists_as_strings_or_lists_give_the_same_cluster(ps, worker):
    c = Cluster.from_hosts(ps=ps, worker=worker, job="worker", task=1)
    assert c.as_dict() == JOBS
    assert c.task == Task("worker", 1)


def test_a_chief_host_list_makes_the_chief_the_chief():
    c = Cluster.from_hosts(chief="h:1", worker="h:2", job="worker", task=0)
    assert not c.is_chief
    assert c.with_task("chief", 0).is_chief


def test_master_is_tf1s_name_for_the_chief_and_trains_first():
    c = Cluster.from_tf_config({"TF_CONFIG": json.dumps({"cluster": {"master": ["h:1"], "worker": ["h:2"],
                                                                     "ps": ["h:3"]},
                                                         "task": {"type": "master", "index": 0}})})
    assert c.is_chief and c.role() == "chief" and c.num_replicas == 2
    assert c.trainers() == [Task("master", 0), Task("worker", 0)]
    assert c.device_filters() == ["/job:ps", "/job:master/task:0"] and c.needed_tasks() == [Task("ps", 0)]
    assert not c.with_task("worker", 0).is_chief


def test_any_job_name_is_a_job_as_tf1s_cluster_spec_allows_one_with_no_role_and_no_filters():
    c = Cluster({"local": ["localhost:2222", "localhost:2223"]}, ("local", 1))   # the tutorials' first cluster
    assert c.role() is None and c.num_replicas == 0 and c.device_filters() == [] and c.needed_tasks() == []
    assert list(Cluster({"ps": ["h:1"], "zeta": ["h:2"], "worker": ["h:3"]}).jobs) == ["worker", "ps", "zeta"]


@pytest.mark.parametrize("job, role, trains, ends_the_run", [
    ("chief", Role.CHIEF, True, True), ("master", Role.CHIEF, True, True), ("worker", Role.WORKER, True, True),
    ("ps", Role.PS, False, False), ("evaluator", Role.EVALUATOR, False, False),
    ("local", None, False, True),     # in-graph TF 1.x: its task runs the program, and its exit ends a launch
])
def test_a_tasks_role_says_whether_it_trains_and_whether_its_exit_ends_a_run(job, role, trains, ends_the_run):
    task = Task(job, 0)
    assert (task.role, task.trains, task.ends_the_run) == (role, trains, ends_the_run)
    assert role is None or role == job.replace("master", "chief")     # roles still compare as TF's strings


def test_a_grpc_scheme_on_an_address_is_dropped():
    c = Cluster({"worker": ["grpc://localhost:2223"]})
    assert c.as_dict() == {"worker": ["localhost:2223"]}


def test_ipv6_addresses_are_accepted_in_brackets():
    assert parse_address("[::1]:2222") == ("::1", 2222)
    c = Cluster.local(ps=1, workers=1, host="::1", base_port=5000)
    assert c.as_dict() == {"worker": ["[::1]:5000"], "ps": ["[::1]:5001"]}


def test_a_jobs_machines_count_every_name_of_loopback_as_one():
    c = Cluster({"worker": ["localhost:9"], "ps": ["localhost:1", "127.0.0.1:2", "[::1]:3", "Node-2:4", "node-2:5"]})
    assert c.hosts("ps") == {"loopback", "node-2"} and c.hosts("evaluator") == set()


def test_a_cluster_cannot_be_changed_after_it_is_built():
    c = Cluster(JOBS, ("ps", 0))
    with pytest.raises(TypeError):
        c.jobs["ps"] = ("h:9",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.task = Task("worker", 0)
    assert c.with_task("worker", 1).task == Task("worker", 1) and c.task == Task("ps", 0)


# ------------------------------------------------------------------ Kubernetes (Kubeflow's TFJob)
# TF_CONFIG exactly as the training operator's genTFConfigJSONStr marshals it (Go sorts map keys; the
# struct's fields come in the order cluster, task, environment): every replica type, lowercased, with its
# headless service's name.
def operator_tf_config(task_type, index, cluster=None):
    cluster = cluster or {"chief": ["digits-chief-0.default.svc:2222"],
                          "evaluator": ["digits-evaluator-0.default.svc:2222"],
                          "ps": ["digits-ps-0.default.svc:2222"],
                          "worker": ["digits-worker-0.default.svc:2222", "digits-worker-1.default.svc:2222"]}
    return json.dumps({"cluster": dict(sorted(cluster.items())), "task": {"type": task_type, "index": index},
                       "environment": "cloud"}, separators=(",", ":"))


def test_the_operators_tf_config_keeps_its_evaluator_out_of_every_sessions_view():
    c = Cluster.from_tf_config({"TF_CONFIG": operator_tf_config("worker", 1)})
    assert c.as_dict() == {"chief": ["digits-chief-0.default.svc:2222"], "ps": ["digits-ps-0.default.svc:2222"],
                           "worker": ["digits-worker-0.default.svc:2222", "digits-worker-1.default.svc:2222"]}
    assert c.task == Task("worker", 1) and c.role() == "worker" and not c.is_chief
    # The ps waits for the done tokens of these, and sync steps count them: the evaluator is not among them.
    assert [str(t) for t in c.trainers()] == ["chief:0", "worker:0", "worker:1"] and c.num_replicas == 3
    assert c.device_filters() == ["/job:ps", "/job:worker/task:1"]
    assert c.needed_tasks() == [Task("ps", 0)]
    assert c.with_task("ps", 0).device_filters() == ["/job:ps/task:0"]
    # What tfcluster start hands its command: TF's documented shape, the evaluator outside the cluster.
    assert "evaluator" not in json.loads(c.tf_config())["cluster"]


def test_the_operators_evaluator_evaluates_outside_the_cluster_and_waits_for_nobody():
    c = Cluster.from_tf_config({"TF_CONFIG": operator_tf_config("evaluator", 0)})
    assert c.task == Task("evaluator", 0) and c.role() == "evaluator"
    assert "evaluator" not in c.jobs and c.needed_tasks() == [] and c.num_replicas == 3


def test_the_operators_master_is_the_chief_end_to_end_of_the_cluster():
    cluster = {"master": ["mnist-master-0.kubeflow.svc:2222"], "ps": ["mnist-ps-0.kubeflow.svc:2222"],
               "worker": ["mnist-worker-0.kubeflow.svc:2222"]}
    c = Cluster.from_tf_config({"TF_CONFIG": operator_tf_config("master", 0, cluster)})
    assert c.task == Task("master", 0) and c.role() == "chief" and c.is_chief and c.chief_task == c.task
    assert [str(t) for t in c.trainers()] == ["master:0", "worker:0"]
    assert c.device_filters() == ["/job:ps", "/job:master/task:0"] and c.needed_tasks() == [Task("ps", 0)]
    w = Cluster.from_tf_config({"TF_CONFIG": operator_tf_config("worker", 0, cluster)})
    assert not w.is_chief and w.chief_task == Task("master", 0)


@pytest.mark.parametrize("environment", ["cloud", "google", "local", ""])
def test_environment_is_accepted_and_changes_nothing(environment):
    data = json.loads(operator_tf_config("ps", 0))
    data["environment"] = environment
    assert Cluster.from_dict(data) == Cluster.from_tf_config({"TF_CONFIG": operator_tf_config("ps", 0)})


def test_a_custom_cluster_domain_and_grpc_rpc_layer_are_accepted():
    cluster = {"ps": ["d-ps-0.ml.svc.cluster.local:2222"], "worker": ["d-worker-0.ml.svc.cluster.local:2222"]}
    data = json.loads(operator_tf_config("worker", 0, cluster))
    data["rpc_layer"] = "grpc"
    c = Cluster.from_dict(data)
    assert c.address(c.task) == "d-worker-0.ml.svc.cluster.local:2222"


def test_a_cluster_file_that_lists_an_evaluator_sets_it_aside_too(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"worker": ["h:1"], "ps": ["h:2"], "evaluator": ["h:3"]}))
    c = Cluster.from_file(str(path))
    assert c.as_dict() == {"worker": ["h:1"], "ps": ["h:2"]}
    assert c.with_task("evaluator", 0).needed_tasks() == []


def test_a_sparse_cluster_beside_the_full_one_is_checked_and_the_full_one_used():
    data = json.loads(operator_tf_config("worker", 1))
    data["sparseCluster"] = {"worker": {"1": data["cluster"]["worker"][1]}, "ps": data["cluster"]["ps"]}
    assert Cluster.from_dict(data) == Cluster.from_tf_config({"TF_CONFIG": operator_tf_config("worker", 1)})
    data["sparseCluster"]["worker"] = {"1": "elsewhere:2222"}
    message = spec_error(lambda: Cluster.from_dict(data, where="TF_CONFIG"))
    assert "'sparseCluster' has worker:1 at 'elsewhere:2222'" in message
    assert "'digits-worker-1.default.svc:2222'" in message


W1, PS0, PS1 = "d-worker-1.default.svc:2222", "d-ps-0.default.svc:2222", "d-ps-1.default.svc:2222"
# With enableDynamicWorker the operator (convertClusterSpecToSparseClusterSpec) tells a worker of the ps and
# itself, a ps of itself alone (as a list of one, whatever its index), the chief and the evaluator of
# nothing: under "sparseCluster" up to operator 1.6, under "cluster" from 1.7 (kubeflow/training-operator#1798).
SPARSE = [
    ("worker, operator 1.6", {"sparseCluster": {"worker": {"1": W1}, "ps": [PS0, PS1]},
                              "task": {"type": "worker", "index": 1}}, ["'sparseCluster'", "worker:1", W1]),
    ("ps 1, operator 1.6", {"sparseCluster": {"worker": {}, "ps": [PS1]}, "task": {"type": "ps", "index": 1}},
     ["'sparseCluster'", "ps:1 is told only", PS1]),
    ("chief, operator 1.6", {"sparseCluster": {"worker": {}, "ps": []}, "task": {"type": "chief", "index": 0}},
     ["'sparseCluster'", "chief:0 is told only {\"worker\":{},\"ps\":[]}"]),
    ("worker, operator 1.7", {"cluster": {"worker": {"1": W1}, "ps": [PS0, PS1]},
                              "task": {"type": "worker", "index": 1}},
     ["job 'worker' is an object {index: address}", "TF's sparse form", "worker:1 is told only", W1]),
    ("ps 0, operator 1.7", {"cluster": {"worker": {}, "ps": [PS0]}, "task": {"type": "ps", "index": 0}},
     ["job 'worker' is an object", "ps:0 is told only"]),
]


@pytest.mark.parametrize("what, data, words", SPARSE, ids=[r[0] for r in SPARSE])
def test_a_sparse_cluster_is_refused_in_one_line_naming_what_the_task_was_told_and_the_fix(what, data, words):
    message = spec_error(lambda: Cluster.from_tf_config({"TF_CONFIG": json.dumps(data)}))
    assert message.startswith("TF_CONFIG: ")
    for w in words + ["needs every task's address", "set enableDynamicWorker to false"]:
        assert w in message, f"{what}: {w!r} not in {message!r}"


# ------------------------------------------------------------------ Slurm
@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("node[1-3,5]", ["node1", "node2", "node3", "node5"]),
    ("n[01-03]", ["n01", "n02", "n03"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("a[1-2],b,gpu[07,09]", ["a1", "a2", "b", "gpu07", "gpu09"]),
])
def test_slurm_compressed_host_lists_expand_in_order(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, nodes, counts", [
    ("1", 1, [1]),
    ("2(x3)", 3, [2, 2, 2]),
    ("2(x2),1", 3, [2, 2, 1]),
    ("1,3", 2, [1, 3]),
])
def test_slurm_tasks_per_node_expand_to_one_count_per_node(text, nodes, counts):
    assert expand_tasks_per_node(text, nodes) == counts


def test_slurm_tasks_get_port_base_plus_k_on_each_node_and_the_first_n_are_ps():
    env = slurm_env("node[1-2],gpu01", "2(x2),1", procid=0)
    c = Cluster.from_slurm(env, ps=1, port_base=9000)
    assert c.as_dict() == {"worker": ["node1:9001", "node2:9000", "node2:9001", "gpu01:9000"],
                           "ps": ["node1:9000"]}
    assert c.task == Task("ps", 0)


@pytest.mark.parametrize("procid, task", [(0, ("ps", 0)), (1, ("ps", 1)), (2, ("worker", 0)), (4, ("worker", 2))])
def test_slurm_procid_picks_this_processs_task(procid, task):
    c = Cluster.from_slurm(slurm_env("n[1-5]", "1(x5)", procid), ps=2)
    assert c.task == Task(*task)


def test_slurm_falls_back_to_the_job_node_list_and_tasks_per_node():
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_PROCID": "1"}
    c = Cluster.from_slurm(env)
    assert c.as_dict() == {"worker": ["n1:8888", "n2:8888"]} and c.task == Task("worker", 1)


# ------------------------------------------------------------------ local counts
def test_local_counts_get_distinct_free_ports_on_localhost():
    c = Cluster.local(ps=1, workers=2)
    addrs = [c.address(t) for t in c.tasks()]
    ports = [parse_address(a)[1] for a in addrs]
    assert [t.job for t in c.tasks()] == ["worker", "worker", "ps"]
    assert all(a.startswith("localhost:") for a in addrs)
    assert len(set(ports)) == 3
    assert all(port_is_free(p) for p in ports)


def test_local_counts_from_a_base_port_are_consecutive_chief_then_workers_then_ps():
    c = Cluster.local(ps=1, workers=2, chief=True, host="10.0.0.5", base_port=7000)
    assert c.as_dict() == {"chief": ["10.0.0.5:7000"], "worker": ["10.0.0.5:7001", "10.0.0.5:7002"],
                           "ps": ["10.0.0.5:7003"]}


# ------------------------------------------------------------------ renders
def test_tf_config_round_trips_through_from_json():
    c = Cluster(JOBS, ("worker", 1))
    text = c.tf_config()
    assert json.loads(text) == {"cluster": JOBS, "task": {"type": "worker", "index": 1}}
    assert Cluster.from_json(text) == c
    assert Cluster.from_json(c.tf_config(Task("ps", 0))).task == Task("ps", 0)
    assert Cluster.from_json(c.to_json()) == Cluster(JOBS)


@pytest.mark.parametrize("style, flags", [
    ("all", ["--job_name=worker", "--task_index=1", "--ps_hosts=localhost:2222",
             "--worker_hosts=localhost:2223,localhost:2224"]),
    ("job-task", ["--job_name=worker", "--task_index=1"]),
    ("none", []),
])
def test_legacy_flags_render_in_each_style(style, flags):
    assert Cluster(JOBS, ("worker", 1)).legacy_flags(style=style) == flags
    assert Cluster(JOBS, ("worker", 1)).legacy_flags(style=LegacyFlags(style)) == flags


@pytest.mark.parametrize("task, filters", [
    (("worker", 1), ["/job:ps", "/job:worker/task:1"]),
    (("ps", 0), ["/job:ps/task:0"]),
])
def test_device_filters_let_a_worker_see_the_ps_and_itself_and_a_ps_only_itself(task, filters):
    assert Cluster(JOBS, task).device_filters() == filters


def test_a_worker_without_ps_sees_only_itself_and_needs_nobody():
    c = Cluster({"worker": ["h:1", "h:2"]}, ("worker", 0))
    assert c.device_filters() == ["/job:worker/task:0"]
    assert c.needed_tasks() == []


def test_a_trainer_needs_the_ps_tasks_and_a_ps_needs_nobody():
    assert Cluster(JOBS, ("worker", 0)).needed_tasks() == [Task("ps", 0)]
    assert Cluster(JOBS, ("ps", 0)).needed_tasks() == []


def test_session_config_and_cluster_spec_render_for_tensorflow():
    import tensorflow as tf
    c = Cluster(JOBS, ("worker", 0))
    config = c.session_config()
    assert isinstance(config, tf.compat.v1.ConfigProto)
    assert config.allow_soft_placement is True
    assert list(config.device_filters) == ["/job:ps", "/job:worker/task:0"]
    assert c.session_config(log_device_placement=True).log_device_placement is True
    spec = c.to_cluster_spec()
    assert isinstance(spec, tf.train.ClusterSpec)
    assert spec.as_dict() == JOBS
    assert spec.task_address("worker", 1) == "localhost:2224"



def test_tasks_that_share_a_machine_get_thread_pools_that_sleep_instead_of_spinning():
    """A spinning TF thread holds a core another task of the same machine needs; alone on a host, a task keeps
    TF's low-latency spinning."""
    local = Cluster({"worker": ["localhost:1", "127.0.0.1:2"], "ps": ["localhost:3"]}, ("ps", 0))
    assert local.shares_machine() and local.session_config().experimental.disable_thread_spinning
    apart = Cluster({"worker": ["a:1", "b:1"], "ps": ["c:1"]}, ("worker", 1))
    assert not apart.shares_machine()
    assert not apart.session_config().experimental.disable_thread_spinning
    two_on_c = Cluster({"worker": ["a:1", "c:2"], "ps": ["c:1"]}, ("ps", 0))
    assert two_on_c.shares_machine() and not two_on_c.shares_machine(Task("worker", 0))

# ------------------------------------------------------------------ refusals
def spec_error(build):
    with pytest.raises(SpecError) as info:
        build()
    message = str(info.value)
    assert "\n" not in message, "a refusal is one line"
    assert isinstance(info.value, TfclusterError) and info.value.exit_code == 2
    return message


# (what is wrong, the cluster JSON, words the message must contain)
JSON_REFUSALS = [
    ("job name that is not a name", {"worker": ["h:1"], "my job": ["h:2"]}, ["'my job'", "not a name"]),
    ("chief and master", {"chief": ["h:1"], "master": ["h:2"]}, ["both 'chief' and 'master'"]),
    ("duplicate address", {"worker": ["h:1"], "ps": ["h:1"]}, ["duplicate", "h:1", "worker:0", "ps:0"]),
    ("localhost and 127.0.0.1 clash", {"worker": ["localhost:5"], "ps": ["127.0.0.1:5"]},
     ["duplicate", "worker:0 at localhost:5", "ps:0 at 127.0.0.1:5", "same socket"]),
    ("port 0", {"worker": ["h:0"]}, ["worker:0", "port 0", "1-65535"]),
    ("port 65536", {"worker": ["h:1", "h:65536"]}, ["worker:1", "65536", "1-65535"]),
    ("non-numeric port", {"worker": ["h:http"]}, ["worker:0", "'http'", "not a number"]),
    ("missing port", {"ps": ["h"], "worker": ["g:1"]}, ["ps:0", "'h'", "host:port"]),
    ("address not a string", {"worker": [2222]}, ["worker:0", "2222", "host:port"]),
    ("empty job list", {"worker": ["h:1"], "ps": []}, ["'ps'", "no tasks"]),
    ("empty job string", {"worker": ""}, ["'worker'", "empty"]),
    ("no jobs", {}, ["no jobs"]),
    ("no worker or chief", {"ps": ["h:1"]}, ["no 'worker' or 'chief'"]),
    ("two chiefs", {"chief": ["h:1", "h:2"], "worker": ["h:3"]}, ["'chief'", "2 tasks", "exactly one"]),
    ("two evaluators in the cluster", {"worker": ["h:1"], "evaluator": ["h:2", "h:3"]},
     ["2 evaluators", "evaluator:0", "Evaluator replicas: 1"]),
    ("evaluator without a port", {"worker": ["h:1"], "evaluator": ["h"]}, ["evaluator:0", "'h'", "host:port"]),
    ("evaluator listed as nothing", {"worker": ["h:1"], "evaluator": []}, ["'evaluator'", "one 'host:port'"]),
    ("task index out of range", {"cluster": JOBS, "task": {"type": "worker", "index": 2}},
     ["index 2", "'worker'", "2 task(s)", "0-1"]),
    ("negative task index", {"cluster": JOBS, "task": {"type": "ps", "index": -1}}, ["index -1", "'ps'"]),
    ("non-numeric task index", {"cluster": JOBS, "task": {"type": "ps", "index": "first"}},
     ["'first'", "whole number"]),
    ("unknown task type", {"cluster": JOBS, "task": {"type": "trainer", "index": 0}},
     ["'trainer'", "this cluster's jobs are"]),
    ("task job not in the cluster", {"cluster": {"worker": ["h:1"]}, "task": {"type": "ps", "index": 0}},
     ["'ps'", "not in the cluster"]),
    ("evaluator index other than 0", {"cluster": JOBS, "task": {"type": "evaluator", "index": 1}},
     ["evaluator index 1"]),
    ("task that is not an object", {"cluster": JOBS, "task": "worker"}, ["'task'"]),
    ("environment that is not a string", {"cluster": JOBS, "environment": 5}, ["'environment'", "5"]),
    ("rpc layer other than grpc", {"cluster": JOBS, "rpc_layer": "grpc+verbs"}, ["'grpc+verbs'", "grpc only"]),
    ("jobs that are not an object", {"cluster": ["h:1"]}, ["job -> addresses", "list"]),
]


def test_keys_beside_cluster_that_tf_ignores_are_ignored_and_an_unknown_one_is_named(caplog):
    vertex = Cluster.from_json(json.dumps({"cluster": JOBS, "task": {"type": "ps", "index": 0},
                                           "job": {"python_module": "trainer.task"}}), where="TF_CONFIG")
    assert str(vertex.task) == "ps:0" and not caplog.records
    Cluster.from_json(json.dumps({"cluster": JOBS, "tasks": {}}), where="TF_CONFIG")
    assert [r.getMessage() for r in caplog.records] == [
        "TF_CONFIG: ignoring unknown key(s) tasks beside 'cluster' (it knows cluster, task, environment, "
        "rpc_layer, sparseCluster)"]


@pytest.mark.parametrize("what, data, words", JSON_REFUSALS, ids=[r[0] for r in JSON_REFUSALS])
def test_a_bad_cluster_json_is_refused_naming_the_culprit(what, data, words):
    message = spec_error(lambda: Cluster.from_json(json.dumps(data), where="spec.json"))
    assert message.startswith("spec.json: ")
    for w in words:
        assert w in message, f"{what}: {w!r} not in {message!r}"


# (what is wrong, the text, words the message must contain)
TEXT_REFUSALS = [
    ("malformed JSON", '{"worker": ["h:1"],\n "ps" ["h:2"]}', ["malformed JSON", "line 2 column 7"]),
    ("truncated JSON", '{"worker": ["h:1"', ["malformed JSON", "line 1 column 18"]),
    ("empty text", "", ["malformed JSON", "line 1 column 1"]),
    ("a list", '["h:1", "h:2"]', ["JSON object", "list"]),
    ("a string", '"h:1"', ["JSON object", "str"]),
]


@pytest.mark.parametrize("what, text, words", TEXT_REFUSALS, ids=[r[0] for r in TEXT_REFUSALS])
def test_text_that_is_not_a_json_object_is_refused_with_where_it_went_wrong(what, text, words):
    message = spec_error(lambda: Cluster.from_json(text, where="spec.json"))
    assert message.startswith("spec.json: ")
    for w in words:
        assert w in message, f"{what}: {w!r} not in {message!r}"


def test_a_missing_cluster_file_is_refused_naming_the_file(tmp_path):
    path = str(tmp_path / "nope.json")
    message = spec_error(lambda: Cluster.from_file(path))
    assert path in message and "No such file" in message


def test_a_malformed_cluster_file_is_refused_naming_the_file_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "worker": ["h:1",]\n}')
    message = spec_error(lambda: Cluster.from_file(str(path)))
    assert message.startswith(f"{path}: malformed JSON at line 2 column")


@pytest.mark.parametrize("env, words", [
    ({}, ["TF_CONFIG is not set"]),
    ({"TF_CONFIG": ""}, ["TF_CONFIG is not set"]),
    ({"TF_CONFIG": "{not json"}, ["TF_CONFIG: malformed JSON", "line 1 column 2"]),
    ({"TF_CONFIG": json.dumps({"cluster": JOBS, "task": {"type": "worker", "index": 5}})},
     ["TF_CONFIG: ", "index 5", "'worker'"]),
    ({"TF_CONFIG": json.dumps({"cluster": JOBS, "task": {"type": "chief", "index": 0}})},
     ["TF_CONFIG: ", "'chief'", "not in the cluster"]),
], ids=["unset", "empty", "malformed", "task index not in cluster", "task job not in cluster"])
def test_a_bad_or_missing_tf_config_is_refused_naming_tf_config(env, words):
    message = spec_error(lambda: Cluster.from_tf_config(env))
    for w in words:
        assert w in message


# (what is wrong, keyword arguments of from_hosts, words the message must contain)
HOST_REFUSALS = [
    ("empty host list", dict(ps=",", worker="h:1"), ["ps: empty host list"]),
    ("job without task", dict(worker="h:1", job="worker"), ["job and task go together"]),
    ("task out of range", dict(worker="h:1", job="worker", task=1), ["index 1", "'worker'"]),
    ("negative task", dict(worker="h:1", job="worker", task=-1), ["index -1"]),
    ("unknown job", dict(worker="h:1", job="master", task=0), ["'master'"]),
    ("no worker", dict(ps="h:1"), ["no 'worker' or 'chief'"]),
    ("bad port", dict(worker="h:99999"), ["worker:0", "99999"]),
    ("list of non-strings", dict(worker={"h": 1}), ["worker: expected", "dict"]),
]


@pytest.mark.parametrize("what, kwargs, words", HOST_REFUSALS, ids=[r[0] for r in HOST_REFUSALS])
def test_bad_host_lists_are_refused_naming_the_culprit(what, kwargs, words):
    message = spec_error(lambda: Cluster.from_hosts(**kwargs))
    for w in words:
        assert w in message, f"{what}: {w!r} not in {message!r}"


# (what is wrong, environment, ps count, words the message must contain)
SLURM_REFUSALS = [
    ("no node list", {"SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_PROCID": "0"}, 0, ["SLURM_STEP_NODELIST"]),
    ("no tasks per node", {"SLURM_STEP_NODELIST": "n1", "SLURM_PROCID": "0"}, 0, ["SLURM_STEP_TASKS_PER_NODE"]),
    ("no procid", {"SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "1"}, 0, ["SLURM_PROCID"]),
    ("procid not a number", slurm_env("n1", "1", "x"), 0, ["SLURM_PROCID='x'"]),
    ("procid out of range", slurm_env("n[1-2]", "1(x2)", 2), 0, ["SLURM_PROCID=2", "2 task(s)"]),
    ("bad range", slurm_env("n[1-x]", "1", 0), 0, ["'1-x'", "n[1-x]"]),
    ("descending range", slurm_env("n[3-1]", "1", 0), 0, ["descending", "'3-1'"]),
    ("unbalanced brackets", slurm_env("n[1-3", "1", 0), 0, ["unbalanced", "n[1-3"]),
    ("bad tasks per node", slurm_env("n1", "two", 0), 0, ["'two'"]),
    ("tasks per node miscount", slurm_env("n[1-3]", "2(x2)", 0), 0, ["'2(x2)'", "2 node(s)", "has 3"]),
    ("every task a ps", slurm_env("n[1-2]", "1(x2)", 0), 2, ["2 ps task(s)", "no worker"]),
    ("negative ps count", slurm_env("n[1-2]", "1(x2)", 0), -1, ["-1", "ps"]),
]


@pytest.mark.parametrize("what, env, ps, words", SLURM_REFUSALS, ids=[r[0] for r in SLURM_REFUSALS])
def test_a_bad_slurm_environment_is_refused_naming_the_culprit(what, env, ps, words):
    message = spec_error(lambda: Cluster.from_slurm(env, ps=ps))
    assert message.startswith("Slurm: ")
    for w in words:
        assert w in message, f"{what}: {w!r} not in {message!r}"


# (what is wrong, keyword arguments of local, words the message must contain)
LOCAL_REFUSALS = [
    ("no workers", dict(ps=1, workers=0), ["workers 0"]),
    ("negative ps", dict(ps=-1), ["ps must", "-1"]),
    ("fractional workers", dict(workers=1.5), ["workers must", "1.5"]),
    ("base port too high", dict(ps=1, workers=2, base_port=65534), ["base_port 65534", "3 ports"]),
    ("base port 0", dict(base_port=0), ["base_port 0"]),
    ("too few ports", dict(ps=1, workers=2, ports=[5000, 5001]), ["3 task(s)", "got 2"]),
]


@pytest.mark.parametrize("what, kwargs, words", LOCAL_REFUSALS, ids=[r[0] for r in LOCAL_REFUSALS])
def test_bad_local_counts_are_refused_naming_the_culprit(what, kwargs, words):
    message = spec_error(lambda: Cluster.local(**kwargs))
    for w in words:
        assert w in message, f"{what}: {w!r} not in {message!r}"


def test_renders_that_need_a_task_refuse_a_cluster_without_one():
    c = Cluster(JOBS)
    for render in (c.tf_config, c.legacy_flags, c.device_filters, lambda: c.is_chief):
        assert "no task given" in spec_error(render)


def test_an_unknown_legacy_flag_style_is_refused():
    assert "'long'" in spec_error(lambda: Cluster(JOBS, ("ps", 0)).legacy_flags(style="long"))


@pytest.mark.parametrize("device,task", [
    ("/job:ps/replica:0/task:1/device:CPU:0", Task("ps", 1)),
    ("/job:ps/task:1/device:CPU:0", Task("ps", 1)),      # once counted as ps:0 (the text after its last colon)
    ("/job:ps/task:12", Task("ps", 12)),
    ("/job:worker/replica:0/task:3", Task("worker", 3)),
    ("/job:ps", Task("ps", 0)),                          # no task: TF places it on the job's first
    ("/job:chief/task:0/device:GPU:1", Task("chief", 0)),
    ("/device:CPU:0", None), ("", None), (None, None)])
def test_the_task_a_device_name_is_on_is_read_one_way_whatever_the_spelling(device, task):
    assert Task.of_device(device) == task
