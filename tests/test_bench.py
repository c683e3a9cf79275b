"""The benchmark's quick mode runs end to end and writes its results (no speed is asserted here)."""

import json
import os
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


def test_a_failed_repeat_drops_out_of_the_paired_ratios_without_shifting_the_others():
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import bench
    a = [bench.cluster_throughput(r) for r in (None, RUN(200.0), RUN(300.0))]
    b = [100.0, 100.0, None]
    assert a[0] is None
    assert bench.ratio(a, b) == [2.0]                 # repeat 2 with repeat 2 only
    assert bench.best([None, 5.0, None], [4.0, 6.0, None]) == [4.0, 6.0, None]


def RUN(examples_per_sec):
    """A run record as the bench keeps it, for one worker without a timeline."""
    return dict(results=[dict(examples_per_sec=examples_per_sec)], layout="1 process")
