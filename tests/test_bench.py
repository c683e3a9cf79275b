"""The benchmark's quick mode runs end to end and writes its results (no speed is asserted here)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, base_env

sys.path.insert(0, os.path.join(REPO, "scripts"))
import bench  # noqa: E402  (it puts scripts/bench on the path for the modules below)
import runs  # noqa: E402
import report  # noqa: E402
from figures import best, figures, met, ratio  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_bench_runs_and_writes_json_a_table_and_plots(tmp_path):
    # The rows of the figures checked below (a quick run's others, one process and the pull, run the same code).
    r = subprocess.run([sys.executable, "scripts/bench.py", "--quick", "--out", str(tmp_path),
                        "--rows", "tfcluster_async,raw_tf1_async,tfcluster_async_bf16"], cwd=REPO,
                       capture_output=True, text=True, timeout=580, env=base_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["mode"] == "quick"
    assert doc["figures"]["P1 tfcluster async / raw TF1 async"]["median"] > 0
    assert doc["figures"]["W1 bfloat16 wire / float32 wire, async"]["median"] > 0
    assert doc["figures"]["P9 a TF1 run's tasks forked / each importing TensorFlow: wall seconds"]["median"] > 0
    assert set(doc["tf1_run_cpu_seconds"]) == {"fork", "no_fork"}
    assert doc["layouts"]["tfcluster_async"] == "2 workers, 1 ps"
    text = (tmp_path / "results.md").read_text()
    assert "| P1 tfcluster async / raw TF1 async |" in text and "with `python scripts/bench.py --quick" in text
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "ratios.png").stat().st_size > 10_000
        assert (tmp_path / "throughput.png").stat().st_size > 10_000


def test_a_failed_repeat_drops_out_of_the_paired_ratios_without_shifting_the_others():
    a = [bench.cluster_throughput(r) for r in (None, RUN(200.0), RUN(300.0))]
    b = [100.0, 100.0, None]
    assert a[0] is None
    assert ratio(a, b) == [2.0]                 # repeat 2 with repeat 2 only
    assert best([None, 5.0, None], [4.0, 6.0, None]) == [4.0, 6.0, None]


def test_a_worker_that_never_stepped_leaves_the_cluster_rate_to_the_others_and_no_start_up_figure():
    # Under load the second worker of a short run may start after the first reached the step target (CI-27).
    stepped = dict(examples_per_sec=1000.0, first_step_at=10.0, last_step_at=12.0, timeline=[(10.0, 1), (12.0, 50)],
                   batch=40)
    idle = dict(examples_per_sec=0.0, first_step_at=None, last_step_at=None, timeline=[(None, 0)], batch=40)
    run = dict(results=[stepped, idle], launched=5.0, exited=13.0, layout="2 workers, 1 ps")
    assert bench.cluster_throughput(run) == 1000.0
    figs = figures({"tfcluster_async": [run]}, {"tfcluster_async": [1000.0]}, {"tf_import": [4.0]})
    assert "P5 s launch to every first step (tfcluster)" not in figs
    assert figs["P6 s last step to every process gone"]["median"] == 1.0


def test_layouts_say_worker_or_workers():
    assert runs.layout(1, 1) == "1 worker, 1 ps"
    assert runs.layout(2) == "2 workers"
    assert runs.layout(2, 1, chief=True) == "chief, 2 workers, 1 ps"


def test_each_figure_is_judged_against_its_goal_and_the_table_says_which_are_missed():
    assert met(">= 1.3", 1.31) is True and met(">= 1.3", 1.2) is False
    assert met("<= 6.5 (TF import 4.5 + 2)", 7.0) is False and met("peer", 3.0) is None
    thr = {"tfcluster_async": [100.0, 110.0], "raw_tf1_async": [100.0, 100.0], "big_async": [10.0, 10.0],
           "big_async_bf16": [14.0, 13.0]}
    figs = figures({}, thr, {})     # no run records: no start-up figures
    assert figs["P1 tfcluster async / raw TF1 async"]["met"] is False           # median 1.05 < 1.2
    assert figs["W2 bigger MLP: bfloat16 wire / float32 wire, async"]["median"] == pytest.approx(1.35)
    meta = dict(date="2026-01-01", machine="m", mode="full", reps=2, steps=10, command="python scripts/bench.py",
                layouts={k: "2 workers, 1 ps" for k in thr})
    md = report.markdown(thr, figs, {}, meta, {})
    assert "| P1 tfcluster async / raw TF1 async | 1.05 | 1.00-1.10 | >= 1.2 | **missed** |" in md
    assert "| W2 bigger MLP: bfloat16 wire / float32 wire, async | 1.35 | 1.30-1.40 | >= 1.3 | met |" in md


def test_the_readme_table_is_rewritten_between_its_marks_and_nowhere_else(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nprose before\n\n{report.BEGIN}\nold table\n{report.END}\n\nprose after\n")
    report.write_readme(str(readme), "| new | table |\n", str(tmp_path / "docs" / "bench"))
    text = readme.read_text()
    assert "old table" not in text and "| new | table |" in text
    assert text.startswith("# x\n\nprose before\n\n") and text.endswith(f"{report.END}\n\nprose after\n")
    assert "[docs/bench/results.json](docs/bench/results.json)" in text
    (tmp_path / "plain.md").write_text("no marks\n")
    with pytest.raises(SystemExit, match="no .* block to rewrite"):
        report.write_readme(str(tmp_path / "plain.md"), "x", str(tmp_path))


def RUN(examples_per_sec):
    """A run record as the bench keeps it, for one worker without a timeline."""
    return dict(results=[dict(examples_per_sec=examples_per_sec)], layout="1 process")


@pytest.mark.timeout(120)
def test_the_input_position_probe_prints_a_row_per_pipeline():
    r = subprocess.run([sys.executable, "scripts/bench/input_position.py"], cwd=REPO, capture_output=True, text=True,
                       timeout=110, env=base_env())
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| none |") or line.startswith("| 10000 |")]
    assert len(rows) == 2 and all(" ms (" in row and " MB |" in row for row in rows), r.stdout


def _ctr_run(by_task, peaks=None, state=None, received=100.0):
    """A click-through run record: one worker's traced traffic, and the ps peaks and state if measured."""
    traffic = dict(worker_received=received, ps_received=received, row_bytes=60.0, dense_bytes=40.0, by_task=by_task)
    return dict(results=[dict(examples_per_sec=1.0, traffic=traffic)], ps_peak=peaks, ps_state=state)


def test_click_through_figures_come_from_the_traced_bytes_and_the_ps_peaks():
    runs = {"ctr_traffic": [_ctr_run({"ps:0": (300.0, 300.0), "ps:1": (100.0, 100.0), "worker:0": (400.0, 400.0)})],
            "ctr_traffic_bf16": [_ctr_run({}, received=52.0)],
            "ctr_async": [_ctr_run({}, peaks={"ps:0": 650e6, "ps:1": 500e6}, state={"ps:0": 300e6, "ps:1": 300e6})]}
    figs = figures(runs, {}, {})
    assert figs["C1 bytes a worker receives per step / (touched rows + dense weights)"]["median"] == 1.0
    c7 = figs["C7 busiest ps's traffic / mean ps's (Zipf-hot rows; dense split as on 2 machines)"]
    assert c7["median"] == pytest.approx(1.5) and c7["met"] is False
    assert figs["C8 bfloat16 wire / float32 wire: bytes a worker receives per step"]["median"] == pytest.approx(0.52)
    beyond = figs["C5 MB a ps holds beyond its variables (peak - state), 2 ps"]
    assert beyond["median"] == pytest.approx(350.0) and beyond["met"] is True      # the larger of the two ps


def test_the_ps_peaks_are_read_from_the_launchers_line():
    line = "[tfcluster] ps memory: ps:0 peak 658.1 MB, ps:1 peak 1.2 GB; limit 20.0 GB each (--ps-memory, cgroup v1)"
    assert runs.ps_peaks(line) == {"ps:0": pytest.approx(658.1e6), "ps:1": pytest.approx(1.2e9)}


def test_rows_may_be_chosen_by_pattern_and_an_unknown_one_is_one_line():
    with pytest.raises(SystemExit, match="no row nothing_\\*"):
        bench.measure(False, steps=10, reps=1, only=["ctr_*", "nothing_*"])


def test_save_figures_pair_each_repeat_s_sharded_and_unsharded_medians():
    # Two repeats of scripts/bench/saves.py's line: 1 GB of state, sharded saves half as long in the first.
    saves = [dict(sharded_seconds=[1.0, 3.0, 2.0], unsharded_seconds=[4.0, 4.0, 5.0], restore_seconds=[0.5, 0.7],
                  state_bytes=1e9),
             dict(sharded_seconds=[2.0], unsharded_seconds=[2.5], restore_seconds=[1.0], state_bytes=1e9), None]
    figs = figures({}, {}, {"saves": saves})
    s1 = figs["S1 full save seconds, 2 ps: sharded / unsharded"]
    assert (s1["min"], s1["max"], s1["n"]) == (0.5, 0.8, 2)
    assert s1["median"] == pytest.approx(0.65) and s1["met"] is False        # the goal is <= 0.6
    assert figs["S2 restore seconds per GB of ps state (sharded)"]["median"] == pytest.approx(0.8)


@pytest.mark.timeout(180)
def test_the_saves_measure_runs_on_2_ps_and_reports_paired_seconds(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tfcluster", "local", "--ps", "2", "--workers", "1", "--log-dir",
                        str(tmp_path / "logs"), "--", sys.executable, "scripts/bench/saves.py"], cwd=REPO,
                       capture_output=True, text=True, timeout=170, env=base_env(BENCH_SAVE_MB=8,
                                                                                 BENCH_SAVE_REPEATS=2))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = runs.parse_bench(r.stdout)[0]
    assert len(line["sharded_seconds"]) == len(line["unsharded_seconds"]) == len(line["restore_seconds"]) == 2
    assert line["state_bytes"] == 2 * (8 << 20)


@pytest.mark.timeout(180)
def test_the_stream_rows_train_on_a_drifting_log_and_the_chief_reports_its_held_out_auc(tmp_path):
    # The bench's ctr_stream_ev row, short: E2 is the AUC in the chief's BENCH line.
    r = subprocess.run([sys.executable, "-m", "tfcluster", "local", "--ps", "2", "--workers", "2", "--log-dir",
                        str(tmp_path / "logs"), "--", sys.executable, "scripts/bench/ctr.py", "--mode", "async",
                        "--steps", "30", "--batch", "128", "--examples", str(30 * 128), "--drift", "0.5",
                        "--data-dir", str(tmp_path / "data"), "--embedding-variables", "--filter-freq", "2",
                        "--steps-to-live", "10", "--checkpoint-dir", str(tmp_path / "run"), "--save-steps", "10"],
                       cwd=REPO, capture_output=True, text=True, timeout=170, env=base_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = runs.parse_bench(r.stdout)
    assert len(lines) == 2 and [x["task"] for x in lines if "auc" in x] == ["worker:0"], lines
    chief = next(x for x in lines if "auc" in x)
    assert 0.5 < chief["auc"] <= 1.0 and chief["auc_step"] >= 30      # the last checkpoint: async may pass 30
    assert sorted(os.listdir(tmp_path / "data")) == ["eval-drift0.5-after3840.tfrecord",
                                                     "train-0-of-2-drift0.5.tfrecord",
                                                     "train-1-of-2-drift0.5.tfrecord"]


def test_embedding_variable_figures_pair_their_runs_with_the_fixed_tables_of_the_same_repeat():
    runs_ = {"ctr_async_ev": [dict(results=[], ps_peak={"ps:0": 300e6, "ps:1": 300e6})],
             "ctr_async": [dict(results=[], ps_peak={"ps:0": 400e6, "ps:1": 200e6})],
             "ctr_stream_ev": [dict(results=[{"auc": 0.80}], ps_peak={"ps:0": 500e6}), None],
             "ctr_stream": [dict(results=[{}, {"auc": 0.79}], ps_peak={"ps:0": 400e6}),
                            dict(results=[{"auc": 0.81}], ps_peak={"ps:0": 400e6})]}
    figs = figures(runs_, {"ctr_async_ev": [900.0], "ctr_async": [1000.0], "ctr_stream_ev": [950.0, None],
                           "ctr_stream": [1000.0, 1000.0]}, {})
    assert figs["E1 embedding variables / fixed tables (H = 100,000): examples/s"]["median"] == pytest.approx(0.9)
    assert figs["E1 embedding variables / fixed tables (H = 100,000): the ps' peak memory"]["median"] == 1.0
    stream = "E1 stream: embedding variables / fixed tables of the same memory: examples/s"
    assert figs[stream]["median"] == pytest.approx(0.95) and figs[stream]["met"] is True
    assert figs["E1 stream: the ps' peak memory, same (1 = the same memory)"]["median"] == pytest.approx(1.25)
    e2 = figs["E2 stream: held-out AUC points, embedding variables - fixed tables of the same memory"]
    assert e2["median"] == pytest.approx(1.0) and e2["n"] == 1 and e2["met"] is True


def test_bfloat16_math_and_prefetch_figures_pair_each_repeat_with_its_float32_and_unprefetched_twin():
    thr = {"ctr_async": [1300.0, 1200.0], "ctr_async_f32": [1000.0, 1000.0], "ctr_async_noprefetch": [1250.0, None],
           "big_single": [300.0], "big_single_f32": [200.0]}
    runs_ = {"ctr_stream": [dict(results=[{"auc": 0.801}]), dict(results=[{"auc": 0.790}])],
             "ctr_stream_f32": [dict(results=[{"auc": 0.800}]), dict(results=[{"auc": 0.795}])],
             "ctr_stream_noprefetch": [dict(results=[{"auc": 0.802}]), None]}
    figs = figures(runs_, thr, {"digits_math": {"bfloat16": [0.97, 0.98], "float32": [0.975, 0.97]}})
    b1 = figs["B1 click-through: bfloat16 math / float32 math"]
    assert b1["median"] == pytest.approx(1.25) and b1["met"] is False and b1["n"] == 2        # goal >= 1.3
    assert figs["B2 click-through: next step's rows fetched during this one / not"]["n"] == 1   # the failed twin
    b3 = figs["B3 stream: held-out AUC points, bfloat16 math - float32 math"]
    assert (b3["min"], b3["max"]) == (pytest.approx(-0.5), pytest.approx(0.1)) and b3["unit"] == "points"
    assert figs["B3 stream: held-out AUC points, rows prefetched - not (async's staleness)"]["median"] == \
        pytest.approx(-0.1)
    b4 = figs["B4 README example (digits, sync): test accuracy points, bfloat16 math - float32 math"]
    assert (b4["min"], b4["max"]) == (pytest.approx(-0.5), pytest.approx(1.0)) and b4["met"] is True
    assert figs["B5 bigger MLP, one process: bfloat16 math / float32 math"]["median"] == pytest.approx(1.5)


def test_the_traced_step_gives_transfers_per_ps_each_way_counting_only_those_that_carry_data():
    # ctr.py's TRAFFIC "requests": per ps, [sent, received, sent with data, received with data].
    traffic = dict(worker_received=1.0, ps_received=1.0, row_bytes=1.0, dense_bytes=1.0, by_task={},
                   requests={"ps:0": [5, 4, 2, 3], "ps:1": [3, 3, 2, 1]},
                   ps_ops={"ps:0": {"ResourceSparseApplyAdagrad": 2, "ResourceGather": 2}, "ps:1": {
                       "ResourceSparseApplyAdagrad": 2}})
    figs = figures({"ctr_traffic": [dict(results=[dict(traffic=traffic)])]}, {}, {})
    assert figs["C9 data transfers a worker sends each ps per step"]["median"] == 2.0
    assert figs["C9 data transfers a worker receives from each ps per step"]["median"] == 2.0
    assert figs["C9 sparse updates per ps per step"]["median"] == 2.0 and figs["C9 sparse updates per ps per step"]["met"]
    # Runs that count each variable's update once (an update made of a gather and scatters: graph/sparse_updates.py)
    # say so in ps_updates, which the figure takes over its op counts.
    traffic["ps_updates"] = {"ps:0": 1.0, "ps:1": 2.0}
    traffic["ps_ops"]["ps:0"] = {"ResourceScatterUpdate": 2, "ResourceSparseApplyAdagrad": 1}
    figs = figures({"ctr_traffic": [dict(results=[dict(traffic=traffic)])]}, {}, {})
    assert figs["C9 sparse updates per ps per step"]["median"] == 1.5
