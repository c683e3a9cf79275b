"""The README's test command passes on a machine without Slurm, root or not; CI still fails without it.

Each case runs ``pytest tests/test_slurm.py`` in a child with Slurm hidden
(the harness searches an empty program path, ``slurmhost.SEARCH_PATH_ENV``):
without ``CI`` every Slurm test is skipped with its reason; with ``CI`` set,
as .ci/run sets it, each one errors instead, since CI installs Slurm first.
"""

import os
import subprocess
import sys

import pytest

import slurmhost
from conftest import REPO, base_env

SLURM_TESTS = 6


def _run_slurm_tests(ci: bool, as_nobody: bool = False, hide: bool = True):
    env = base_env(PYTHONDONTWRITEBYTECODE="1", HOME="/tmp")
    env.pop("CI", None)
    if ci:
        env["CI"] = "1"
    if hide:
        empty = os.path.join(REPO, "tests", "no-such-dir")      # nothing found there: Slurm is not installed
        env[slurmhost.SEARCH_PATH_ENV] = empty
    cmd = [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-q", "-rs", "--rootdir", REPO,
           os.path.join(REPO, "tests", "test_slurm.py")]
    if as_nobody:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + cmd
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd="/tmp")


@pytest.mark.timeout(150)
def test_without_slurm_and_without_ci_every_slurm_test_skips_with_its_reason():
    r = _run_slurm_tests(ci=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{SLURM_TESTS} skipped" in r.stdout, r.stdout
    assert "no test Slurm: Slurm is not installed" in r.stdout, r.stdout


@pytest.mark.timeout(150)
@pytest.mark.skipif(os.geteuid() != 0, reason="checks the non-root case by switching from root to nobody")
def test_as_a_user_who_is_not_root_every_slurm_test_skips_with_its_reason():
    r = _run_slurm_tests(ci=False, as_nobody=True, hide=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{SLURM_TESTS} skipped" in r.stdout, r.stdout
    assert "no test Slurm:" in r.stdout, r.stdout


@pytest.mark.timeout(150)
def test_on_ci_a_slurm_test_that_cannot_run_fails_instead():
    r = _run_slurm_tests(ci=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{SLURM_TESTS} error" in r.stdout, r.stdout
    assert "no test Slurm: Slurm is not installed" in r.stdout, r.stdout
