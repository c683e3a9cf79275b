"""A 16-bit wire: weights and gradients cross between ps and workers in bfloat16, the ps keeps float32.

The cluster test runs ``tests/jobs/wire_job.py`` (variables from get_variable,
tf.compat.v1.layers and a tf-keras layer) on 1 ps + 2 sync workers, once with
``tfcluster local --wire bfloat16`` and once in float32, and reads a traced
step of each: the partition graphs say which dtype each tensor crossing tasks
has (a bfloat16 tensor can only leave the task that cast it), and the
RecvTensor lines of the traces say how many bytes each crossing moved (three traced steps).
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, base_env

JOB = os.path.join(REPO, "tests", "jobs", "wire_job.py")
#: The job's trainable variables: w 32x64, layer 64x64 + 64, keras 64x4 + 4.
PARAMS = 32 * 64 + 64 * 64 + 64 + 64 * 4 + 4


def test_a_wire_type_is_checked_and_named_as_the_caller_named_it(monkeypatch):
    from tfcluster import strategies
    from tfcluster.core.errors import SpecError
    with pytest.raises(SpecError) as e:
        strategies.get("async", wire="int8")
    assert str(e.value) == "wire must be one of float32, bfloat16, float16, got 'int8'"
    assert e.value.naming({"wire": "--wire"}).startswith("--wire must be one of")
    with pytest.raises(SpecError, match="use 'bfloat16'"):
        strategies.get("collective", wire="float16")
    monkeypatch.setenv("TFCLUSTER_WIRE", "half")
    with pytest.raises(SpecError, match=r"^TFCLUSTER_WIRE='half' must be one of"):
        strategies.get("sync")
    monkeypatch.setenv("TFCLUSTER_WIRE", "bfloat16")
    assert strategies.get("sync").wire.dtype == "bfloat16"
    assert strategies.get("sync", wire="float32").wire.dtype == "float32"


@pytest.mark.timeout(60)
def test_16_bit_wires_round_trip_large_and_small_values():
    import tensorflow as tf

    from tfcluster.graph.wire import pack, unpack
    x = np.array([3e5, -7e4, 1.5, -2e-3, 1e-6, 0.0], np.float32)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        t = tf.constant(x)
        got = {w: session.run(unpack(*pack(t, w))) for w in ("bfloat16", "float16")}
    # bfloat16 keeps float32's range with 8 bits of mantissa; float16 is scaled into its range, 11 bits.
    np.testing.assert_allclose(got["bfloat16"], x, rtol=2 ** -8)
    np.testing.assert_allclose(got["float16"][:3], x[:3], rtol=2 ** -11)
    assert np.all(np.isfinite(got["float16"]))


def _run(tmp_path, wire):
    ckpt = tmp_path / wire
    cmd = [sys.executable, "-m", "tfcluster", "local", "--ps", "1", "--workers", "2", "--wire", wire,
           "--log-dir", str(tmp_path / f"logs-{wire}"), "--timeout", "100", "--", sys.executable, JOB,
           "--mode", "sync", "--steps", "150", "--ckpt", str(ckpt)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=base_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    transfers = {}          # task -> every traced step's transfers
    for line in lines:
        if "TRANSFERS " in line:
            transfers.setdefault(line.split("]")[0].lstrip("["), []).append(json.loads(line.split("TRANSFERS ", 1)[1]))
    result = json.loads(next(line for line in lines if "RESULT " in line).split("RESULT ", 1)[1])
    return transfers, result, r.stdout


def _bytes(received, src, dst):
    return sum(r["bytes"] for r in received if r["src"] == src and r["dst"] == dst)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None, reason="the job uses a tf-keras layer")
def test_bfloat16_wire_halves_the_bytes_casts_on_the_sending_side_and_trains_as_float32(tmp_path):
    narrow, narrow_result, out = _run(tmp_path, "bfloat16")
    wide, wide_result, _ = _run(tmp_path, "float32")
    assert "weights and gradients travel as bfloat16 (5 variable(s)" in out
    assert set(narrow) == {"worker:0", "worker:1"}
    for worker in ("worker:0", "worker:1"):
        assert len(narrow[worker]) == len(wide[worker]) == 3           # three traced steps each
        for step in narrow[worker]:
            sends = step["sends"]
            # The weights leave the ps, and their gradients the worker, already cast and in one tensor each way
            # (graph/crossing.py's packs): bfloat16 on the wire.
            assert sum(s["src"] == "ps:0" and s["dtype"] == "bfloat16" for s in sends) == 1, sends
            assert sum(s["dst"] == "ps:0" and s["dtype"] == "bfloat16" for s in sends) == 1, sends
            # A sync wait loops on the ps alone: no part of its while loop crosses to a worker each iteration.
            assert not [s["name"] for s in sends if "/while/" in s["name"]]
        assert not any(s["dtype"] == "bfloat16" for step in wide[worker] for s in step["sends"])
        # The bytes: 2 per parameter each way (a float32 step moves 4), plus a few scalars (steps, stamps). TF's
        # trace can miss a RecvTensor of a loaded machine's step (CI-37: 8864 of 12,936 bytes), never add one: the
        # fullest of the three traced steps is the step's traffic.
        for src, dst in (("ps:0", worker), (worker, "ps:0")):
            got = max(_bytes(step["received"], src, dst) for step in narrow[worker])
            full = max(_bytes(step["received"], src, dst) for step in wide[worker])
            assert 2 * PARAMS <= got <= 2 * PARAMS + 64, (src, dst, got)
            assert 4 * PARAMS <= full <= 4 * PARAMS + 64, (src, dst, full)
    # The ps kept float32: the checkpoint holds every variable as float32.
    assert narrow_result["dtypes"] == {"w": "float32", "layer/kernel": "float32", "layer/bias": "float32",
                                       "keras/kernel": "float32", "keras/bias": "float32", "global_step": "int64"}
    assert narrow_result["global_step"] == wide_result["global_step"] == 150
    assert narrow_result["accuracy"] >= 0.9
    assert abs(narrow_result["accuracy"] - wide_result["accuracy"]) <= 0.02, (narrow_result, wide_result)
    assert abs(narrow_result["loss"] - wide_result["loss"]) <= 0.05, (narrow_result, wide_result)
