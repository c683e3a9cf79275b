"""A model directory TF 1.x's canned estimators wrote keeps working under tfcluster, and the other way round.

tests/fixtures/canned holds four small model directories written by tensorflow-estimator 2.15 with its own
Estimator in one plain process (scripts/canned_reference.py write): a 3-class DNN, a linear classifier on Ftrl,
wide & deep over crossed, hashed and embedded columns, and a DNN regressor on Adam, with what each predicted.
"""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import forks
from conftest import base_env
from test_tf1_gaps import TF1

HERE = __import__("pathlib").Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures" / "canned"
MODELS = ["dnn", "linear_ftrl", "wide_deep", "dnn_regressor"]


def max_difference(ours: list, theirs: list) -> float:
    """The largest difference between two lists of predictions, over every key they share."""
    assert len(ours) == len(theirs) > 0
    return max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for a, b in zip(ours, theirs) for k in b)


@pytest.fixture(scope="module")
def picked_up(tmp_path_factory):
    """tfcluster's estimators on copies of the fixtures: predictions, 10 more steps, metrics; a warm start."""
    base = tmp_path_factory.mktemp("canned_ckpt") / "models"
    shutil.copytree(FIXTURES, base)
    out = base.parent / "out.json"
    r = forks.run(TF1 + [HERE / "programs" / "canned_restore.py", base, out], base_env(), cwd=base.parent, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return base, json.loads(out.read_text())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", MODELS)
def test_tfcluster_restores_a_tf_1x_model_dir_and_predicts_the_same(picked_up, name):
    _, got = picked_up
    theirs = json.loads((FIXTURES / name / "predictions.json").read_text())
    assert max_difference(got[name]["before"], theirs) <= 1e-5


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", MODELS)
def test_a_tf_1x_model_dir_trains_on_from_its_step_with_its_optimizer_slots(picked_up, name):
    _, got = picked_up
    assert got[name]["global_step"] == 70          # 60 steps of TF 1.x's, 10 of tfcluster's
    assert any(v.endswith(("/Adagrad", "/Ftrl", "/Adam")) for v in got[name]["variables"])
    assert max_difference(got[name]["after"], got[name]["before"]) > 0     # it trained
    assert "average_loss" in got[name]["metrics"]


@pytest.mark.timeout(300)
def test_warm_start_from_a_tf_1x_model_dir_takes_its_weights(picked_up):
    _, got = picked_up
    # Learning rate 0 after the warm start: the new model predicts what the model it started from does.
    assert got["warm"]["global_step"] == 1
    assert max_difference(got["warm"]["predictions"], got["dnn"]["after"]) <= 1e-5


@pytest.mark.timeout(300)
def test_tf_1x_canned_estimators_read_the_checkpoints_tfcluster_wrote(picked_up, tmp_path):
    base, got = picked_up
    out = tmp_path / "theirs.json"
    r = subprocess.run([sys.executable, str(HERE.parent / "scripts" / "canned_reference.py"), "predict", str(base),
                        str(out)], capture_output=True, text=True, env=base_env(), timeout=240, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = json.loads(out.read_text())
    for name in MODELS:
        assert max_difference(got[name]["after"], theirs[name]) <= 1e-5, name
