"""A catalogue of bad input, end to end: one clear line, a non-zero exit, an end inside the stated bound.

Each row runs the real ``tfcluster`` command (``local`` where a whole cluster
makes sense, ``start`` for a task that waits on other hosts) in a child
process and checks three things: exactly one error line on stderr that names
the culprit, the exit code, and that the command ended inside its bound
(bounded waits use ``--timeout``; each bound is several times what the row takes
alone, so the rows run beside other tests). Errors found before anything starts are
``tfcluster: error: ...`` with exit 2 and nothing started; a task that fails
once started is named by the launcher in one ``[tfcluster] error:`` line on
stderr with its own last exception line and its log file.

Not repeated here (same promise, already tested): the CLI's own catalogue in
test_cli.py (malformed spec for ``start``, unknown job, index out of range,
port 0 in host lists, duplicate addresses, evaluators in the spec, TF_CONFIG
naming a missing job, ...), ``local --workers 0``, ``--max-restarts -1``,
``--timeout 0``, a missing program in test_local.py, a taken ``--ports``
port and the legacy options in test_tf1.py, a port in use for ``start`` in
test_server.py.
"""

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from conftest import TFCLUSTER, base_env
from tfcluster.core import environment
from tfcluster.core.checks import choice_from, seconds_from, switch_from
from tfcluster.core.logs import debug_wanted
from tfcluster.core.errors import SpecError
from tfcluster.topology.ports import pick_free_ports

HERE = os.path.dirname(os.path.abspath(__file__))
FIT_JOB = os.path.join(HERE, "jobs", "fit_job.py")
PY = sys.executable

# What happens after "local" fails at once: exit 2, one line, nothing started.
USAGE = "usage"
# A task or a wait that fails after the start: the launcher's (or start's) one error line.
RUN = "run"


@pytest.fixture
def world(tmp_path, procs):
    """Files and ports the rows refer to as {name}; a real process holds {held}."""
    free = pick_free_ports(3)
    files = {
        "malformed.json": '{"worker": ["localhost:%d"],\n  "ps": ["localhost:%d"' % (free[0], free[1]),
        "empty.json": "",
        "list.json": json.dumps([f"localhost:{free[0]}"]),
        "badname.json": json.dumps({"worker": [f"localhost:{free[0]}"], "my job": [f"localhost:{free[1]}"]}),
        "dup.json": json.dumps({"worker": [f"localhost:{free[0]}"], "ps": [f"127.0.0.1:{free[0]}"]}),
        "big.json": json.dumps({"worker": [f"localhost:{free[0]}"], "ps": ["localhost:70000"]}),
        "evaluators.json": json.dumps({"worker": [f"localhost:{free[0]}"],
                                       "evaluator": [f"localhost:{free[1]}", f"localhost:{free[2]}"]}),
        "train.py": "print('training')\n",
        "crash.py": "import no_such_module_xyz\n",
        # TF 1.x table code (TF1 mode): a hash bucket count below 1, more parts than rows, an id past its column.
        "hash.py": "import tensorflow as tf\ncolumn = tf.feature_column.categorical_column_with_hash_bucket('c', -5)\n",
        "parts.py": "import tensorflow as tf\nwith tf.variable_scope('s', partitioner=lambda shape, dtype: [5, 1]):\n"
                    "    tf.get_variable('table', [3, 4])\n",
        "identity.py": "import numpy as np\nimport tensorflow as tf\n"
                       "column = tf.feature_column.categorical_column_with_identity('id', num_buckets=10)\n"
                       "data = ({'id': np.array([[1], [12], [3]])}, np.array([0, 1, 0]))\n"
                       "model = tf.estimator.LinearClassifier([column], model_dir='model')\n"
                       "model.train(lambda: tf.data.Dataset.from_tensor_slices(data).repeat().batch(3), steps=3)\n",
        "blocker": "a file where a directory is expected\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "adir.json").mkdir()
    holder = procs.start([PY, "-c", "import socket, time\ns = socket.socket(); s.bind(('', 0)); s.listen()\n"
                                    "print(s.getsockname()[1], flush=True); time.sleep(120)"])
    held = int(holder.stdout.readline())
    (tmp_path / "taken.json").write_text(json.dumps({"worker": [f"localhost:{free[0]}"],
                                                     "ps": [f"localhost:{held}"]}))
    return {"tmp": str(tmp_path), "py": PY, "free": free[0], "free2": free[1], "held": held,
            "holder": holder.pid, "job": FIT_JOB}


# (what is wrong, kind, tfcluster arguments, words the error line must hold, exit code, bound in seconds)
CATALOGUE = [
    # ------------------------------------------------ cluster files given to local
    ("malformed JSON", USAGE, "local --cluster {tmp}/malformed.json -- {py} train.py",
     ["{tmp}/malformed.json", "malformed JSON at line 2"], 2, 20),
    ("truncated (empty) JSON", USAGE, "local --cluster {tmp}/empty.json -- {py} train.py",
     ["{tmp}/empty.json", "malformed JSON at line 1 column 1"], 2, 20),
    ("JSON that is not an object", USAGE, "local --cluster {tmp}/list.json -- {py} train.py",
     ["{tmp}/list.json", "expected a JSON object, got list"], 2, 20),
    ("job name that is not a name", USAGE, "local --cluster {tmp}/badname.json -- {py} train.py",
     ["job name 'my job' is not a name"], 2, 20),
    ("duplicate address", USAGE, "local --cluster {tmp}/dup.json -- {py} train.py",
     ["duplicate address", "worker:0 at localhost:{free}", "ps:0 at 127.0.0.1:{free}"], 2, 20),
    ("port above 65535", USAGE, "local --cluster {tmp}/big.json -- {py} train.py",
     ["port 70000", "out of range 1-65535"], 2, 20),
    ("port 0", USAGE, "local --ps 1 --workers 1 --ports 0,{free} -- {py} train.py",
     ["worker:0", "port 0", "out of range"], 2, 20),
    ("two evaluators listed inside the cluster", USAGE, "local --cluster {tmp}/evaluators.json -- {py} train.py",
     ["{tmp}/evaluators.json", "the cluster lists 2 evaluators"], 2, 20),
    ("cluster file that is a directory", USAGE, "local --cluster {tmp}/adir.json -- {py} train.py",
     ["cannot read cluster file {tmp}/adir.json", "Is a directory"], 2, 20),
    ("port in use, holder named", USAGE, "local --no-isolate --cluster {tmp}/taken.json -- {py} train.py",
     ["port {held} of ps:0", "already in use", "held by pid {holder}"], 2, 20),
    # ------------------------------------------------------------- local options
    ("negative --timeout", USAGE, "local --timeout -5 -- {py} train.py", ["--timeout must be a positive number"],
     2, 20),
    ("negative --ps", USAGE, "local --ps -1 -- {py} train.py", ["--ps must be a whole number >= 0, got -1"], 2, 20),
    ("negative --evaluator-grace", USAGE, "local --evaluator --evaluator-grace -1 -- {py} train.py",
     ["--evaluator-grace must be >= 0"], 2, 20),
    ("unresolvable --host", USAGE, "local --host no-such-host.invalid -- {py} train.py",
     ["--host 'no-such-host.invalid' does not resolve"], 2, 20),
    ("--host that is not this machine", USAGE, "local --host 192.0.2.1 -- {py} train.py",
     ["--host 192.0.2.1", "not an address of this machine"], 2, 20),
    ("log dir that cannot be made", USAGE, "local --log-dir {tmp}/blocker/logs -- {py} train.py",
     ["cannot create log dir {tmp}/blocker/logs", "Not a directory"], 2, 20),
    ("missing script", USAGE, "local -- {py} {tmp}/no_such_train.py --steps 3",
     ["no such script: {tmp}/no_such_train.py"], 2, 20),
    # ------------------------------------------------------------ TF_CONFIG to start
    ("TF_CONFIG naming a task index not in the cluster", USAGE, "start -- {py} train.py",
     ["TF_CONFIG", "index 3 is out of range for job 'worker'"], 2, 20),
    # --------------------------------------------------- failures once running
    ("script that crashes at import", RUN, "local --ps 0 --workers 1 --log-dir {tmp}/logs -- {py} crash.py",
     ["worker:0 exited with code 1", "(ModuleNotFoundError: No module named 'no_such_module_xyz')",
      "see its log: {tmp}/logs/worker-0.log"], 1, 30),
    ("checkpoint dir that cannot be made", RUN,
     "local --ps 0 --workers 1 --log-dir {tmp}/logs -- {py} {job} --steps 5 --ckpt {tmp}/blocker/ckpt",
     ["worker:0 exited with code 2",
      "(cannot write checkpoint dir {tmp}/blocker/ckpt: Not a directory)",
      "see its log: {tmp}/logs/worker-0.log"], 2, 90),
    ("hash bucket count below 1", RUN, "local --tf1 --ps 0 --workers 1 --log-dir {tmp}/logs -- {py} hash.py",
     ["worker:0 exited with code 2", "hash.py:2: hash_bucket_size must be at least 1. hash_bucket_size: -5"], 2, 60),
    ("partitioner asking for more parts than rows", RUN,
     "local --tf1 --ps 0 --workers 1 --log-dir {tmp}/logs -- {py} parts.py",
     ["worker:0 exited with code 2", "a partitioner asked for 5 parts along axis 0 of a variable of shape [3, 4]"],
     2, 60),
    ("id outside its identity column", RUN, "local --tf1 --ps 0 --workers 1 --log-dir {tmp}/logs -- {py} identity.py",
     ["worker:0 exited with code 2", "a training step failed on its input", "id/weighted_sum", "on worker:0",
      "indices[1] =", " 12 ", "(an id is outside its table"], 2, 90),
    ("a duration TF1 mode reads from the environment that is not a number", RUN,
     "local --tf1 --ps 0 --workers 1 --log-dir {tmp}/logs -- {py} train.py",
     ["worker:0 exited with code 2", "TFCLUSTER_TF1_READY_POLL_SECS='soon' must be a positive number of seconds"],
     2, 60),
    ("unreachable ps host", RUN,
     "start --ps 192.0.2.1:{free2} --worker localhost:{free} --job worker --task 0 --timeout 3",
     ["gave up after 3s waiting for /job:ps/task:0 at 192.0.2.1:{free2}"], 3, 60),
    ("unresolvable ps host", RUN,
     "start --ps no-such-host.invalid:{free2} --worker localhost:{free} --job worker --task 0 --timeout 3",
     ["gave up after 3s waiting for /job:ps/task:0 at no-such-host.invalid:{free2} (host does not resolve)"],
     3, 60),
]
ENVIRONMENTS = {
    "a duration TF1 mode reads from the environment that is not a number":
        {"TFCLUSTER_TF1_READY_POLL_SECS": "soon"},
    "TF_CONFIG naming a task index not in the cluster":
        {"TF_CONFIG": json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]},
                                  "task": {"type": "worker", "index": 3}})},
}
# Rows whose command loads TensorFlow: several seconds each on a loaded machine.
SLOW = {"checkpoint dir that cannot be made", "unreachable ps host", "unresolvable ps host", "hash bucket count below 1",
        "partitioner asking for more parts than rows", "id outside its identity column",
        "a duration TF1 mode reads from the environment that is not a number"}


def run_tfcluster(argv, cwd, env, bound):
    start = time.monotonic()
    r = subprocess.run(TFCLUSTER + argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=bound + 30)
    return r, time.monotonic() - start


def check_one_clear_line(what, kind, r, took, words, code, bound):
    assert r.returncode == code, f"{what}: exit {r.returncode}, wanted {code}\n{r.stderr[-2000:]}"
    assert took < bound, f"{what}: took {took:.1f}s, bound {bound}s"
    assert "Traceback" not in r.stderr, f"{what}: a traceback on stderr:\n{r.stderr[-2000:]}"
    if kind == USAGE:
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("tfcluster: error: "), f"{what}: {r.stderr!r}"
        assert "started (pid" not in r.stdout, f"{what}: something started:\n{r.stdout}"
    else:
        lines = [line for line in r.stderr.splitlines() if "error:" in line]
        assert len(lines) == 1, f"{what}: wanted one error line on stderr:\n{r.stderr[-2000:]}"
    for w in words:
        assert w in lines[0], f"{what}: {w!r} not in {lines[0]!r}"
    return lines[0]


@pytest.mark.parametrize(
    "what, kind, args, words, code, bound",
    [pytest.param(*row, marks=[pytest.mark.slow] if row[0] in SLOW else [], id=row[0]) for row in CATALOGUE])
def test_bad_input_is_one_clear_line_a_non_zero_exit_and_an_end_inside_the_bound(
        world, what, kind, args, words, code, bound):
    argv = [a.format(**world) for a in shlex.split(args)]
    env = base_env(**ENVIRONMENTS.get(what, {}))
    # The child must quiet TensorFlow and gRPC by itself: the user's environment will not.
    env.pop("TF_CPP_MIN_LOG_LEVEL")
    env.pop("GRPC_VERBOSITY")
    r, took = run_tfcluster(argv, world["tmp"], env, bound)
    line = check_one_clear_line(what, kind, r, took, [w.format(**world) for w in words], code, bound)
    print(f"\n{what}: exit {r.returncode} after {took:.1f}s: {line}")
    if kind == USAGE and argv[0] == "local" and "--no-isolate" not in argv:
        # Refused before anything was made (a taken port is only known once the ports are held).
        assert r.stdout == "" and not os.path.exists(os.path.join(world["tmp"], "tfcluster-logs"))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_checkpoint_dir_on_a_read_only_filesystem_fails_before_the_first_step(world, tmp_path):
    # Root writes through permission bits, so the read-only dir is a read-only bind mount, made in a
    # mount namespace of the command's own: nothing outside it sees the mount.
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs root and mount namespaces to make a read-only filesystem")
    ckpt = tmp_path / "ro"
    ckpt.mkdir()
    inner = TFCLUSTER + ["local", "--ps", "0", "--workers", "1", "--log-dir", str(tmp_path / "logs"), "--", PY,
                         FIT_JOB, "--steps", "5", "--ckpt", str(ckpt)]
    script = (f"mount --bind {ckpt} {ckpt} && mount -o remount,bind,ro {ckpt} && exec "
              + " ".join(shlex.quote(a) for a in inner))
    start = time.monotonic()
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                       text=True, cwd=str(tmp_path), env=base_env(), timeout=110)
    line = check_one_clear_line("read-only checkpoint dir", RUN, r, time.monotonic() - start,
                                ["worker:0 exited with code 2",
                                 f"(cannot write checkpoint dir {ckpt}: Read-only file system)"],
                                2, 90)
    print(f"\n{line}")
    # It failed before training: no step ran, so no work was lost at a first save.
    assert "first step done" not in r.stdout
    assert os.listdir(ckpt) == []


@pytest.mark.parametrize("variable", [environment.SYNC_STALL_SECS, environment.SYNC_TIMEOUT_SECS,
                                      environment.TF1_READY_POLL_SECS, environment.TF1_STOP_GRACE_SECS])
def test_a_duration_read_from_the_environment_is_its_default_when_unset_and_one_line_when_not_a_positive_number(
        variable):
    assert seconds_from(variable, 7.0, {}) == 7.0 and seconds_from(variable, 7.0, {variable.name: " "}) == 7.0
    assert seconds_from(variable, 7.0, {variable.name: "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(SpecError, match=rf"^{variable.name}='{bad}' must be a positive number of seconds$"):
            seconds_from(variable, 7.0, {variable.name: bad})


@pytest.mark.parametrize("variable", [environment.DEBUG, environment.START_OVER, environment.PREFETCH,
                                      environment.TF_CHECKED])
def test_a_switch_read_from_the_environment_is_its_default_when_unset_off_at_0_and_one_line_when_neither(variable):
    assert switch_from(variable, True, {}) is True and switch_from(variable, False, {variable.name: " "}) is False
    for on in ("1", "true", "Yes", "ON"):
        assert switch_from(variable, False, {variable.name: on}) is True, on
    for off in ("0", "false", "No", "off"):
        assert switch_from(variable, True, {variable.name: off}) is False, off
    with pytest.raises(SpecError, match=rf"^{variable.name}='maybe' must be 1 or 0 \(or true/yes/on, false/no/off\)$"):
        switch_from(variable, False, {variable.name: "maybe"})


def test_tfcluster_debug_0_turns_debug_lines_off(monkeypatch):
    # Any value turned them on once, 0 included.
    monkeypatch.setenv(environment.DEBUG.name, "0")
    assert not debug_wanted() and debug_wanted(verbose=True)
    monkeypatch.setenv(environment.DEBUG.name, "1")
    assert debug_wanted()


@pytest.mark.parametrize("variable,name,choices,default", [(environment.WIRE, "wire", ("float32", "bfloat16"), "float32"),
                                                           (environment.MATH, "math", ("auto", "float32"), "auto")])
def test_a_choice_is_the_argument_else_the_variable_else_its_default_and_a_bad_one_names_where_it_came_from(
        variable, name, choices, default):
    assert choice_from(name, None, variable, choices, default, {}) == default
    assert choice_from(name, None, variable, choices, default, {variable.name: f" {choices[1]} "}) == choices[1]
    assert choice_from(name, choices[0], variable, choices, default, {variable.name: choices[1]}) == choices[0]
    with pytest.raises(SpecError, match=rf"^{variable.name}='x' must be one of {', '.join(choices)}$"):
        choice_from(name, None, variable, choices, default, {variable.name: "x"})
    with pytest.raises(SpecError, match=rf"^{name} must be one of {', '.join(choices)}, got 'x'$") as caught:
        choice_from(name, "x", variable, choices, default, {})
    assert caught.value.naming({name: f"--{name}"}).startswith(f"--{name} must be one of")
