"""The benchmark's quick mode runs end to end and writes its results (no speed is asserted here)."""

import json
import subprocess
import sys

import pytest

from conftest import REPO, base_env


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_bench_runs_and_writes_json_and_a_table(tmp_path):
    r = subprocess.run([sys.executable, "scripts/bench.py", "--quick", "--out", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, timeout=580, env=base_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["mode"] == "quick"
    p1 = doc["figures"]["P1 tfcluster async / raw TF1 async"]
    assert p1["median"] > 0
    assert "| P1 tfcluster async / raw TF1 async |" in (tmp_path / "results.md").read_text()
