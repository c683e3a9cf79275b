"""The ``tfcluster`` command line: one-line errors, help, spec, status, and the walk-through it prints.

Errors and help run the real command in a child process with TensorFlow's and
gRPC's log settings removed from its environment, so the CLI has to keep its
own stderr clean.
"""

import argparse
import json
import re
import shlex
import signal
import sys
import textwrap

import pytest

from conftest import TFCLUSTER, base_env, no_process_left, run_cli, wait_until
from held_ports import REUSE
from tfcluster.cli import build_parser, cluster_from_args
from tfcluster.topology.cluster import Cluster, Task, parse_address
from tfcluster.core.errors import TfclusterError
from tfcluster.runtime.server import probe


def raw_env(**extra):
    """A child's environment without the TF/gRPC quieting, so tfcluster must quiet them itself."""
    env = base_env(**extra)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    env.pop("GRPC_VERBOSITY", None)
    return env


#: The commands tfcluster has, as the README's Layout table names them.
COMMANDS = ["horovodrun", "local", "spec", "start", "status"]


def subcommands():
    """The commands the parser knows, sorted."""
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(action.choices)


def status_rows(stdout):
    """``{(job, index): (address, state)}`` from the table ``tfcluster status`` prints."""
    lines = stdout.strip().splitlines()
    assert lines[0].split() == ["JOB", "INDEX", "ADDRESS", "STATE"]
    return {(job, int(index)): (address, state)
            for job, index, address, state in (line.split() for line in lines[1:])}


# ------------------------------------------------------------------ user errors
@pytest.fixture
def spec_files(tmp_path, ports):
    """A good spec, a malformed one and one with an unknown job; ``{name}`` placeholders for args."""
    good = tmp_path / "cluster.json"
    good.write_text(Cluster.local(ps=1, workers=2, ports=ports(3)).to_json())
    bad = tmp_path / "bad.json"
    bad.write_text('{"worker": ["localhost:1",\n  "localhost:2"')
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"worker": ["localhost:1"], "my job": ["localhost:2"]}')
    evaluator = tmp_path / "evaluator.json"
    evaluator.write_text('{"worker": ["localhost:1"], "evaluator": ["localhost:2", "localhost:3"]}')
    return {"spec": str(good), "bad": str(bad), "unknown": str(unknown), "evaluator": str(evaluator),
            "missing": str(tmp_path / "no.json")}


# (what is wrong, the arguments, extra environment, words the one error line must contain)
USER_ERRORS = [
    ("malformed spec", "start --cluster {bad} --job ps --task 0", {},
     ["{bad}", "malformed JSON at line 2"]),
    ("missing spec file", "start --cluster {missing} --job ps --task 0", {}, ["{missing}", "No such file"]),
    ("job name that is not a name in the spec", "status --cluster {unknown}", {}, ["{unknown}", "'my job'"]),
    ("job not in the cluster", "start --cluster {spec} --job master --task 0", {}, ["job 'master' is not in the cluster"]),
    ("index out of range", "start --cluster {spec} --job worker --task 2", {},
     ["index 2", "'worker'", "0-1"]),
    ("negative index", "start --cluster {spec} --job ps --task -1", {}, ["index -1", "'ps'"]),
    ("index not a number", "start --cluster {spec} --job ps --task one", {}, ["--task", "'one'"]),
    ("job without task", "start --cluster {spec} --job ps", {}, ["--job and --task"]),
    ("no task at all", "start --cluster {spec}", {}, ["--job and --task"]),
    ("no cluster source", "start --job ps --task 0", {}, ["no cluster given"]),
    ("two cluster sources", "status --cluster {spec} --ps localhost:5 --worker localhost:6", {},
     ["--cluster and host lists"]),
    ("unknown option", "start --cluster {spec} --job ps --task 0 --bogus", {}, ["--bogus"]),
    ("unknown command", "frobnicate", {}, ["'frobnicate'"]),
    ("port 0 in a host list", "status --ps localhost:0 --worker localhost:6", {}, ["ps:0", "port 0"]),
    ("duplicate address in host lists", "status --ps localhost:7 --worker 127.0.0.1:7", {},
     ["duplicate", "worker:0 at 127.0.0.1:7", "ps:0 at localhost:7"]),
    ("duplicate within a job", "status --worker localhost:6 --chief localhost:7 --ps localhost:8,localhost:8", {},
     ["duplicate", "localhost:8", "ps:0", "ps:1"]),
    ("two evaluators in the spec", "status --cluster {evaluator}", {}, ["{evaluator}", "2 evaluators"]),
    ("malformed TF_CONFIG", "start", {"TF_CONFIG": '{"cluster": '}, ["TF_CONFIG", "malformed JSON"]),
    ("TF_CONFIG naming a missing task", "start",
     {"TF_CONFIG": json.dumps({"cluster": {"worker": ["localhost:6"]}, "task": {"type": "ps", "index": 0}})},
     ["TF_CONFIG", "'ps'", "not in the cluster"]),
    ("slurm without its environment", "start --slurm", {}, ["SLURM_STEP_NODELIST"]),
    ("empty host list", "status --ps , --worker localhost:6", {}, ["--ps: empty host list"]),
    ("evaluator without a command", "start --cluster {spec} --job evaluator --task 0", {}, ["evaluator", "--"]),
    ("status with a command", "status --cluster {spec} -- python x.py", {}, ["status", "--"]),
    ("spec with no workers", "spec --workers 0", {}, ["--workers 0"]),
    ("spec with a base port too high", "spec --base-port 65535", {}, ["--base-port 65535"]),
    ("spec to an unwritable place", "spec -o {missing}/x.json", {}, ["cannot write", "{missing}/x.json"]),
    # --ps is a list of addresses in start and status, a number of tasks in local and spec; each says so.
    ("a number of ps where start takes addresses", "start --ps 2 --worker localhost:6 --job worker --task 0", {},
     ["--ps", "'2' is a number of tasks; here it takes addresses", "local and spec"]),
    ("an address where spec takes a number", "spec --ps localhost:2222", {},
     ["--ps", "'localhost:2222' is an address; here it takes a number of tasks", "start and status"]),
    ("a stray word before the command", "start --cluster {spec} --job ps --task 0 run.sh", {},
     ["'run.sh' is not an option, a script or python", "'--'"]),
    # horovodrun's line: another host, or too few slots, names what to run instead.
    ("horovodrun on another host", "horovodrun -np 2 -H server7:2 python train.py", {},
     ["-H server7:2: server7 is another host", "tfcluster start --job worker --task I"]),
    ("horovodrun with too few slots", "horovodrun -np 4 -H localhost:2 python train.py", {},
     ["-np 4 needs 4 slots; -H localhost:2 has 2"]),
    ("horovodrun with a hostfile", "horovodrun -np 2 --hostfile hosts python train.py", {},
     ["--hostfile: tfcluster starts no process on other hosts"]),
    ("horovodrun with MPI's options", "horovodrun -np 2 --mpi python train.py", {},
     ["unrecognized arguments: --mpi"]),
]


@pytest.mark.parametrize("what, args, env, words", USER_ERRORS, ids=[e[0] for e in USER_ERRORS])
def test_a_user_error_is_one_line_on_stderr_with_exit_2_and_no_traceback(spec_files, what, args, env, words):
    argv = [a.format(**spec_files) for a in shlex.split(args)]
    result = run_cli(*argv, env=raw_env(**env))
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, f"{what}: {result.stderr!r}"
    assert lines[0].startswith("tfcluster: error: ")
    assert "Traceback" not in result.stderr + result.stdout
    for w in words:
        assert w.format(**spec_files) in lines[0], f"{what}: {w!r} not in {lines[0]!r}"


def test_the_parser_knows_every_promised_command_and_no_other():
    assert subcommands() == COMMANDS


# The promised commands too, so that a parser that lost its commands gives failures, not an empty list.
@pytest.mark.parametrize("command", [None] + sorted(set(COMMANDS) | set(subcommands())))
def test_help_of_every_command_exits_0_and_shows_usage(command):
    result = run_cli(*([command] if command else []), "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: tfcluster") and result.stderr == ""


def test_the_top_level_help_lists_every_command_with_its_summary():
    out = run_cli("--help").stdout
    # One row per command: its name at the start of an indented line, then what it does (below a long name).
    listed = re.findall(r"^    (\w+)(?: +|\n {6,})\S", out, re.M)
    assert sorted(listed) == COMMANDS


# ------------------------------------------------------------------ sources through the CLI
def parse(*argv):
    return build_parser().parse_args(["start", *argv])


def test_legacy_spellings_give_the_same_cluster_as_the_new_ones():
    legacy = cluster_from_args(parse("--ps_hosts", "h:1", "--worker_hosts", "h:2,h:3",
                                     "--job_name", "worker", "--task_index", "1"))
    new = cluster_from_args(parse("--ps", "h:1", "--worker", "h:2,h:3", "--job", "worker", "--task", "1"))
    assert legacy == new == Cluster.from_hosts(ps="h:1", worker="h:2,h:3", job="worker", task=1)


def test_tf_config_is_the_source_when_no_other_is_given_and_flags_pick_another_task(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["h:2", "h:3"], "ps": ["h:1"]},
                                                "task": {"type": "worker", "index": 1}}))
    assert cluster_from_args(parse()).task == Task("worker", 1)
    assert cluster_from_args(parse("--job", "ps", "--task", "0")).task == Task("ps", 0)
    # An explicit source wins over TF_CONFIG.
    assert cluster_from_args(parse("--worker", "g:9", "--job", "worker", "--task", "0")).as_dict() == \
        {"worker": ["g:9"]}


def test_slurm_is_a_source_with_its_ps_count_and_port_base(monkeypatch):
    for k, v in {"SLURM_STEP_NODELIST": "n[1-3]", "SLURM_STEP_TASKS_PER_NODE": "1(x3)", "SLURM_PROCID": "1"}.items():
        monkeypatch.setenv(k, v)
    c = cluster_from_args(parse("--slurm", "--slurm-ps", "1", "--slurm-port-base", "7000"))
    assert c.as_dict() == {"worker": ["n2:7000", "n3:7000"], "ps": ["n1:7000"]}
    assert c.task == Task("worker", 0)


def test_status_needs_no_task():
    args = build_parser().parse_args(["status", "--worker", "h:2"])
    assert cluster_from_args(args, need_task=False).task is None
    with pytest.raises(TfclusterError):
        cluster_from_args(args)


# ------------------------------------------------------------------ start with a command
ECHO = "import os, sys; print('argv', sys.argv[1:]); print('tf_config', os.environ['TF_CONFIG']); sys.exit({code})"


def test_start_runs_the_command_with_tf_config_and_no_legacy_flags_unless_asked(ports):
    p0, p1 = ports(2)
    hosts = ["--worker", f"localhost:{p0},localhost:{p1}", "--job", "worker", "--task", "1"]
    plain = run_cli("start", *hosts, "--", sys.executable, "-c", ECHO.format(code=0), "--lr", "1",
                    env=base_env(**REUSE))
    assert plain.returncode == 0, plain.stderr
    assert "argv ['--lr', '1']" in plain.stdout
    tf_config = json.loads(plain.stdout.split("tf_config ", 1)[1].splitlines()[0])
    assert tf_config == {"cluster": {"worker": [f"localhost:{p0}", f"localhost:{p1}"]},
                         "task": {"type": "worker", "index": 1}}

    legacy = run_cli("start", *hosts, "--legacy-flags", "job-task", "--", sys.executable, "-c", ECHO.format(code=0),
                     env=base_env(**REUSE))
    assert "argv ['--job_name=worker', '--task_index=1']" in legacy.stdout


def test_start_says_in_one_line_that_a_loopback_address_does_not_keep_the_server_off_the_network(ports):
    (p0,) = ports(1)
    r = run_cli("start", "--worker", f"localhost:{p0}", "--job", "worker", "--task", "0", "--", sys.executable,
                "-c", "pass", env=base_env(**REUSE))
    notes = [line for line in r.stderr.splitlines() if "every interface" in line]
    assert len(notes) == 1 and notes[0].endswith(
        f"tfcluster: note: worker:0's server listens on port {p0} of every interface, not only localhost, with no "
        f"authentication: firewall port {p0} to the cluster's own hosts, or run a one-machine cluster with "
        f"tfcluster local, which isolates it"), r.stderr


def test_start_runs_a_script_given_without_dashes_with_this_python(ports, tmp_path):
    (p0,) = ports(1)
    script = tmp_path / "echo.py"
    script.write_text(ECHO.format(code=0))
    result = run_cli("start", "--worker", f"localhost:{p0}", "--job", "worker", "--task", "0", script, "--lr", "1",
                     env=base_env(**REUSE))
    assert result.returncode == 0, result.stderr
    assert "argv ['--lr', '1']" in result.stdout


def test_start_exits_with_the_code_of_its_command(ports):
    (p0,) = ports(1)
    result = run_cli("start", "--worker", f"localhost:{p0}", "--job", "worker", "--task", "0", "--",
                     sys.executable, "-c", ECHO.format(code=7), env=raw_env(**REUSE))
    assert result.returncode == 7
    assert "worker:0 exited with code 7" in result.stderr
    assert "Traceback" not in result.stderr


def test_start_names_a_command_that_cannot_run(ports):
    (p0,) = ports(1)
    result = run_cli("start", "--worker", f"localhost:{p0}", "--job", "worker", "--task", "0", "--",
                     "/no/such/program", env=raw_env(**REUSE))
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == "tfcluster: error: cannot run '/no/such/program': No such file or directory"


SLEEPER = "import time; print('ready', flush=True); time.sleep(120)"


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_start_reaches_its_command_and_leaves_no_process(procs, ports, sig, code):
    (p0,) = ports(1)
    start = procs.cli("start", "--worker", f"localhost:{p0}", "--job", "worker", "--task", "0", "--",
                      sys.executable, "-c", SLEEPER, env=raw_env(**REUSE))
    wait_until(lambda: start.stdout.readline().strip() == "ready", 30, "the command to print 'ready'")
    pids = [p.pid for p in procs.descendants()]
    assert len(pids) == 2
    start.send_signal(sig)
    out, _ = start.communicate(timeout=30)
    assert start.returncode == code, out
    assert no_process_left(pids)


# ------------------------------------------------------------------ spec
def test_spec_writes_a_loadable_spec_and_prints_one_start_line_per_task_ps_first(tmp_path):
    path = tmp_path / "cluster.json"
    result = run_cli("spec", "--ps", "1", "--workers", "2", "-o", path, "--", "python", "train.py", "--steps", "5")
    assert result.returncode == 0, result.stderr
    cluster = Cluster.from_file(str(path))
    assert [str(t) for t in cluster.tasks()] == ["worker:0", "worker:1", "ps:0"]
    assert len({parse_address(cluster.address(t))[1] for t in cluster.tasks()}) == 3
    starts = [line for line in result.stdout.splitlines() if line.startswith("tfcluster start")]
    assert starts == [
        f"tfcluster start --cluster {path} --job ps --task 0",
        f"tfcluster start --cluster {path} --job worker --task 0 -- python train.py --steps 5",
        f"tfcluster start --cluster {path} --job worker --task 1 -- python train.py --steps 5",
    ]
    assert f"tfcluster status --cluster {path}" in result.stdout
    assert path.stat().st_mode & 0o777 == 0o600        # the addresses of servers that run any graph: private.py


def test_spec_without_output_prints_the_json_and_a_chief_with_consecutive_ports():
    result = run_cli("spec", "--ps", "1", "--workers", "1", "--chief", "--host", "10.1.2.3", "--base-port", "6000")
    assert result.returncode == 0, result.stderr
    text = result.stdout.split("#", 1)[0]
    assert json.loads(text) == {"chief": ["10.1.2.3:6000"], "worker": ["10.1.2.3:6001"], "ps": ["10.1.2.3:6002"]}
    starts = [line for line in result.stdout.splitlines() if line.startswith("tfcluster start")]
    assert starts == ["tfcluster start --cluster cluster.json --job ps --task 0",
                      "tfcluster start --cluster cluster.json --job chief --task 0 -- python train.py",
                      "tfcluster start --cluster cluster.json --job worker --task 0 -- python train.py"]


# ------------------------------------------------------------------ status and the walk-through
def test_status_reports_every_task_down_and_exits_1_when_nothing_runs(ports):
    p0, p1 = ports(2)
    result = run_cli("status", "--worker", f"localhost:{p0}", "--ps", f"localhost:{p1}", "--timeout", "0.5",
                     env=raw_env())
    assert result.returncode == 1
    assert status_rows(result.stdout) == {("worker", 0): (f"localhost:{p0}", "down"),
                                          ("ps", 0): (f"localhost:{p1}", "down")}
    assert result.stderr.splitlines() == ["tfcluster: 2 of 2 task(s) down: worker:0, ps:0"]


WALK_WORKER = textwrap.dedent("""
    import os, sys, time
    from tfcluster import server_from_tf_config

    cluster, server = server_from_tf_config(timeout=90)
    print(cluster.task, "is up and reaches its ps", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists({go!r}):
        if time.monotonic() > deadline:
            sys.exit("nobody said go")
        time.sleep(0.1)
""")


@pytest.mark.slow
@pytest.mark.timeout(170)
def test_the_printed_walk_through_brings_a_cluster_up_that_status_sees_and_it_ends_by_itself(tmp_path, procs):
    go = tmp_path / "go"
    worker_py = tmp_path / "worker.py"
    worker_py.write_text(WALK_WORKER.format(go=str(go)))
    spec = tmp_path / "cluster.json"
    printed = run_cli("spec", "--ps", "1", "--workers", "2", "-o", spec, "--", sys.executable, worker_py)
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    starts = [shlex.split(line) for line in lines if line.startswith("tfcluster start")]
    status_cmd = shlex.split(next(line for line in lines if "tfcluster status" in line).split("# check them: ")[1])
    cluster = Cluster.from_file(str(spec))

    def status():
        result = run_cli(*status_cmd[1:], "--timeout", "1", env=raw_env())
        return result.returncode, status_rows(result.stdout)

    # Terminal 1: the ps. Status sees it up and the workers down.
    ps = procs.start(TFCLUSTER + starts[0][1:], env=raw_env())
    wait_until(lambda: probe(cluster, [Task("ps", 0)], timeout=0.5)[Task("ps", 0)] == "up", 90,
               f"ps:0 to answer at {cluster.address(Task('ps', 0))}")
    code, rows = status()
    assert code == 1
    assert {k: v[1] for k, v in rows.items()} == {("ps", 0): "up", ("worker", 0): "down", ("worker", 1): "down"}

    # Terminals 2 and 3: the workers. Status sees every task up.
    workers = [procs.start(TFCLUSTER + argv[1:], env=raw_env()) for argv in starts[1:]]
    wait_until(lambda: set(probe(cluster, timeout=0.5).values()) == {"up"}, 120, "every task to answer")
    code, rows = status()
    assert code == 0
    assert rows == {(t.job, t.index): (cluster.address(t), "up") for t in cluster.tasks()}
    pids = [p.pid for p in procs.descendants()]

    # The workers finish; their tfcluster start tells the ps, which then ends by itself.
    go.write_text("")
    for w in workers:
        out, _ = w.communicate(timeout=60)
        assert w.returncode == 0, out
        assert "is up and reaches its ps" in out
    ps_out, _ = ps.communicate(timeout=60)
    assert ps.returncode == 0, ps_out
    assert "every trainer is done" in ps_out
    code, rows = status()
    assert code == 1 and {v[1] for v in rows.values()} == {"down"}
    assert no_process_left(pids)
