"""Installing tfcluster: one version, TensorFlow as a choice, and a guard where TensorFlow is missing or doubled.

The package is built into a real wheel from ``pyproject.toml`` and installed
into a fresh venv that has no TensorFlow; its own dependencies (grpcio,
psutil) are linked in from this venv, so nothing is downloaded. The warnings
about two TensorFlow builds, or another version, are shown with distributions
of the test's own (``*.dist-info`` folders on PYTHONPATH), read the way the
guard reads every install: by ``importlib.metadata``.
"""

import email
import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata

import pytest

from conftest import REPO, base_env, run_cli
from held_ports import REUSE
import tfcluster
from tfcluster.core import tfguard

NO_TF = "TensorFlow is not installed ({}); pip install 'tfcluster[tensorflow]' (or 'tfcluster[tensorflow-cpu]')"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """tfcluster built into a wheel from this checkout's files, as pip builds it (in a copy: a build leaves
    build/ and egg-info folders behind)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    shutil.copytree(os.path.join(REPO, "tfcluster"), src / "tfcluster", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                        "-q", "-w", str(out), str(src)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    (path,) = out.glob("tfcluster-*.whl")
    return path


def wheel_metadata(path):
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        entry = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        return email.message_from_string(z.read(name).decode()), z.read(entry).decode()


def test_the_wheel_has_one_version_a_python_range_and_tensorflow_only_as_extras(wheel):
    meta, entry_points = wheel_metadata(wheel)
    assert meta["Version"] == tfcluster.__version__
    assert meta["Requires-Python"] in (">=3.10,<3.14", "<3.14,>=3.10")
    requires = meta.get_all("Requires-Dist")
    assert [r for r in requires if "extra ==" not in r] == ["grpcio>=1.60", "psutil>=5.9"]
    assert sorted(meta.get_all("Provides-Extra")) == ["bench", "examples", "legacy", "pandas", "tensorboard",
                                                      "tensorflow", "tensorflow-cpu", "test"]
    assert 'tensorflow==2.21.*; extra == "tensorflow"' in requires
    assert 'tensorflow-cpu==2.21.*; extra == "tensorflow-cpu"' in requires
    assert 'tf-keras==2.21.*; extra == "legacy"' in requires
    # TF 1.x's canned estimators (tfcluster/estimator/canned.py knows this version's internals).
    assert 'tensorflow-estimator==2.15.0; extra == "legacy"' in requires
    # TensorFlow 2.21 no longer brings TensorBoard, which reads the summaries fit writes.
    assert 'tensorboard==2.21.*; extra == "tensorboard"' in requires
    assert "tfcluster = tfcluster.cli:run" in entry_points


def test_setup_py_is_a_shim_that_reads_its_metadata_from_pyproject():
    # For tools that still run ``python setup.py develop``; a setup.py with metadata of its own once
    # pinned another TensorFlow than pyproject.toml did.
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
        assert f.read().split() == ["from", "setuptools", "import", "setup", "setup()"]
    r = subprocess.run([sys.executable, "setup.py", "--name", "--version"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["tfcluster", tfcluster.__version__]


def _link_distribution(name: str, into):
    """Symlink the installed files of distribution ``name`` (its packages and dist-info) into ``into``."""
    dist = metadata.distribution(name)
    for top in {f.parts[0] for f in dist.files if not f.parts[0].startswith("..")}:
        target = dist.locate_file(top)
        if os.path.exists(target) and not (into / top).exists():
            (into / top).symlink_to(target)


@pytest.fixture(scope="module")
def no_tf_venv(tmp_path_factory, wheel):
    """A fresh venv with tfcluster installed from its wheel, grpcio and psutil, and no TensorFlow."""
    root = tmp_path_factory.mktemp("no-tf")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=180)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    deps = root / "deps"
    deps.mkdir()
    for name in ("grpcio", "psutil", "typing-extensions"):
        _link_distribution(name, deps)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "tfcluster-test-deps.pth"), "w") as f:
        f.write(str(deps) + "\n")
    return venv


def venv_env(venv):
    """The environment of a process in ``venv``: its bin first, and nothing that imports this checkout."""
    env = {k: v for k, v in base_env().items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    return env


def in_venv(venv, *args, cwd, timeout=60):
    return subprocess.run([str(venv / "bin" / "tfcluster"), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=str(cwd), env=venv_env(venv))


def python_in_venv(venv, code, cwd):
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=str(cwd), env=venv_env(venv))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_without_tensorflow_spec_status_and_the_parser_work_and_the_rest_names_the_extra(no_tf_venv, tmp_path):
    check = python_in_venv(no_tf_venv, "import importlib.util as u, tfcluster; print(u.find_spec('tensorflow'), "
                                       "tfcluster.__file__)", tmp_path)
    where = str(no_tf_venv)
    assert check.stdout.split() == ["None", check.stdout.split()[1]] and check.stdout.split()[1].startswith(where)

    spec = in_venv(no_tf_venv, "spec", "--ps", "1", "--workers", "1", "-o", tmp_path / "c.json", cwd=tmp_path)
    assert spec.returncode == 0, spec.stderr
    status = in_venv(no_tf_venv, "status", "--cluster", tmp_path / "c.json", "--timeout", "0.5", cwd=tmp_path)
    assert status.returncode == 1 and status.stdout.startswith("JOB") and "Traceback" not in status.stderr
    parsed = python_in_venv(no_tf_venv, "import tfcluster; print(tfcluster.Cluster.from_hosts(ps='h:1', "
                                        "worker='h:2,h:3', job='worker', task=1).tf_config())", tmp_path)
    assert parsed.returncode == 0, parsed.stderr
    assert json.loads(parsed.stdout) == {"cluster": {"worker": ["h:2", "h:3"], "ps": ["h:1"]},
                                         "task": {"type": "worker", "index": 1}}

    start = in_venv(no_tf_venv, "start", "--cluster", tmp_path / "c.json", "--job", "ps", "--task", "0", cwd=tmp_path)
    assert start.returncode == 2
    assert start.stderr.splitlines() == ["tfcluster: error: " + NO_TF.format("hosting ps:0's server needs it")]

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    local = in_venv(no_tf_venv, "local", "--ps", "1", "--workers", "1", "--", "python", "-c", "pass", cwd=run_dir)
    assert local.returncode == 2 and local.stdout == ""
    assert local.stderr.splitlines() == ["tfcluster: error: " + NO_TF.format("hosting the ps tasks needs it")]
    assert os.listdir(run_dir) == []       # nothing was started


def fake_distribution(root, name, version):
    """A ``*.dist-info`` folder that importlib.metadata reads as an installed distribution."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.mark.skipif(set(tfguard.installed_builds()) != {"tensorflow-cpu"} and
                    set(tfguard.installed_builds()) != {"tensorflow"},
                    reason="the test adds a second build to exactly one installed TensorFlow build")
def test_two_tensorflow_builds_installed_give_one_warning_line_per_run(tmp_path):
    (real, version), = tfguard.installed_builds().items()
    other = "tensorflow" if real == "tensorflow-cpu" else "tensorflow-cpu"
    fake_distribution(tmp_path / "dists", other, version)
    env = base_env(PYTHONPATH=f"{tmp_path / 'dists'}{os.pathsep}{base_env()['PYTHONPATH']}")
    r = run_cli("local", "--ps", "0", "--workers", "2", "--", sys.executable, "-c", "pass", cwd=str(tmp_path),
                env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    warnings = [line for line in r.stdout.splitlines() if line.startswith("[tfcluster] warning: ")]
    builds = " and ".join(f"{n} {version}" for n in tfguard.BUILDS if n in (real, other))
    assert warnings == [f"[tfcluster] warning: {builds} are installed: they share one tensorflow/ folder, so the last "
                        "one installed overwrote the other (a GPU build may have lost its GPUs); keep one: pip "
                        f"uninstall -y {' '.join(n for n in tfguard.BUILDS if n in (real, other))}, then pip install "
                        "'tfcluster[tensorflow]' (or 'tfcluster[tensorflow-cpu]')"]


def test_another_tensorflow_version_gives_one_warning_line(tmp_path, ports):
    (real, _), = list(tfguard.installed_builds().items())[:1]
    fake_distribution(tmp_path / "dists", real, "2.20.0")       # found first on the path: it shadows the real one
    env = base_env(PYTHONPATH=f"{tmp_path / 'dists'}{os.pathsep}{base_env()['PYTHONPATH']}", **REUSE)
    (port,) = ports(1)
    r = run_cli("start", "--worker", f"localhost:{port}", "--job", "worker", "--task", "0", "--", sys.executable,
                "-c", "pass", env=env)
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 1
    assert warnings[0].endswith(f"tfcluster: warning: {real} 2.20.0 is installed; tfcluster is built and tested for "
                                "TensorFlow 2.21.x: pip install 'tfcluster[tensorflow]' (or "
                                "'tfcluster[tensorflow-cpu]')")


def test_the_check_reads_metadata_and_warns_once_per_run(monkeypatch):
    assert tfguard.tensorflow_warnings({"tensorflow": "2.21.0"}) == []
    assert tfguard.tensorflow_warnings({"tensorflow": "2.21.0rc1"}) == []
    assert len(tfguard.tensorflow_warnings({"tensorflow": "2.21.0", "tensorflow-cpu": "2.21.0"})) == 1
    assert len(tfguard.tensorflow_warnings({"tf-nightly": "2.22.0.dev1"})) == 1
    shown = []
    monkeypatch.setattr(tfguard, "installed_builds", lambda: {"tensorflow": "2.19.0"})
    monkeypatch.setattr(tfguard.log, "warning", lambda fmt, line: shown.append(line))
    environ = {}
    tfguard.check_tensorflow(environ=environ)
    tfguard.check_tensorflow(environ=environ)      # a task the command started: it inherited the marker
    assert len(shown) == 1 and environ == {tfguard.CHECKED_ENV: "1"}


def test_a_task_that_must_import_this_tfcluster_is_given_the_folder_that_holds_it():
    from tfcluster.topology import taskenv
    assert os.path.isfile(os.path.join(taskenv.PACKAGE_ROOT, "tfcluster", "__init__.py"))
    env = taskenv.task_environment(tfcluster.Cluster.local(workers=1, ports=[1]).with_task("worker", 0),
                                   base={}, import_tfcluster=True)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == taskenv.PACKAGE_ROOT
