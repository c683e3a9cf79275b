"""bfloat16 math where the CPU has it (graph/precision.py): on by default only on CPUs that multiply bfloat16 in
hardware, off on request, a program's own choice kept, and the examples' accuracy kept.

The rest of the suite pins float32 (tests/conftest.py); these tests ask for their math themselves.
"""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, base_env
from tfcluster.core.errors import SpecError
from tfcluster.graph import precision

ZEN4 = "flags\t\t: fpu vme sse sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
SAPPHIRE_RAPIDS = "flags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n"
SKYLAKE = "flags\t\t: fpu vme sse sse2 avx2 avx512f avx512bw\n"


def _flags(tmp_path, text):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\n" + text + "processor\t: 1\n" + text)
    return precision.cpu_flags(str(path))


def test_auto_is_bfloat16_only_where_the_cpu_multiplies_bfloat16_and_onednn_is_on(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    assert precision.resolve_math("auto", _flags(tmp_path, ZEN4)) == "bfloat16"
    assert precision.resolve_math("auto", _flags(tmp_path, SAPPHIRE_RAPIDS)) == "bfloat16"
    assert precision.resolve_math("auto", _flags(tmp_path, SKYLAKE)) == "float32"
    assert precision.resolve_math("auto", precision.cpu_flags(str(tmp_path / "no-such-file"))) == "float32"
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")        # TF's own kernels: bfloat16 would be slower
    assert precision.resolve_math("auto", _flags(tmp_path, ZEN4)) == "float32"
    # Asked for by name, either way, whatever the CPU.
    assert precision.resolve_math("bfloat16", _flags(tmp_path, SKYLAKE)) == "bfloat16"
    assert precision.resolve_math("float32", _flags(tmp_path, ZEN4)) == "float32"


def test_the_math_comes_from_tfcluster_math_and_a_bad_value_is_one_line(monkeypatch):
    monkeypatch.setenv("TFCLUSTER_MATH", "half")
    with pytest.raises(SpecError, match=r"^TFCLUSTER_MATH='half' must be one of auto, bfloat16, float32$"):
        precision.resolve_math()
    with pytest.raises(SpecError, match="must be one of auto, bfloat16, float32, got 'fp8'"):
        precision.resolve_math("fp8")
    monkeypatch.setenv("TFCLUSTER_MATH", "float32")
    assert precision.resolve_math() == "float32"


def test_a_session_config_gets_the_rewrite_unless_it_chose_for_itself(monkeypatch):
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2
    toggle = rewriter_config_pb2.RewriterConfig
    monkeypatch.setenv("TFCLUSTER_MATH", "bfloat16")
    config = precision.configure(tf.compat.v1.ConfigProto())
    assert precision.is_on(config)
    own = tf.compat.v1.ConfigProto()
    own.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 = toggle.OFF
    assert not precision.is_on(precision.configure(own))
    monkeypatch.setenv("TFCLUSTER_MATH", "float32")
    assert not precision.is_on(precision.configure(tf.compat.v1.ConfigProto()))


def test_a_session_on_a_task_server_gets_bfloat16_math_without_the_fusions_that_have_no_bfloat16_kernel(monkeypatch):
    # There TF's own _FusedConv2D takes the remapper's fused convolutions, and it has no bfloat16; the README
    # example, a CNN on 1 ps + 2 workers, failed with "Value for attr 'T' of bfloat16 is not in the list".
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2
    toggle = rewriter_config_pb2.RewriterConfig
    monkeypatch.setenv("TFCLUSTER_MATH", "bfloat16")
    remote = precision.configure(tf.compat.v1.ConfigProto(), target=b"grpc://localhost:2222")
    assert precision.is_on(remote) and remote.graph_options.rewrite_options.remapping == toggle.OFF
    here = precision.configure(tf.compat.v1.ConfigProto(), target="")
    assert precision.is_on(here) and here.graph_options.rewrite_options.remapping == toggle.DEFAULT
    own = tf.compat.v1.ConfigProto()
    own.graph_options.rewrite_options.remapping = toggle.ON
    assert precision.configure(own, target="grpc://localhost:2222").graph_options.rewrite_options.remapping == toggle.ON
    monkeypatch.setenv("TFCLUSTER_MATH", "float32")
    f32 = precision.configure(tf.compat.v1.ConfigProto(), target="grpc://localhost:2222")
    assert f32.graph_options.rewrite_options.remapping == toggle.DEFAULT


def _digits(tmp_path, math):
    out = subprocess.run([sys.executable, "-m", "tfcluster", "local", "--ps", "1", "--workers", "2", "--math", math,
                          "--log-dir", str(tmp_path / f"logs-{math}"), "--", sys.executable,
                          os.path.join(REPO, "examples", "digits.py"), "--mode", "sync", "--checkpoint-dir",
                          str(tmp_path / f"run-{math}")], capture_output=True, text=True, timeout=280, env=base_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return float(re.search(r"test accuracy (\d\.\d+)", out.stdout).group(1)), out.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_readme_example_keeps_its_accuracy_with_bfloat16_math(tmp_path, reliability):
    # Tested where the CPU multiplies bfloat16 (this machine: AVX512-BF16); elsewhere "auto" is float32, and
    # that choice is tested above on the CPUs' flag lists.
    if not precision.cpu_has_bfloat16():
        pytest.skip("this CPU lists neither avx512_bf16 nor amx_bf16 (or oneDNN is off): auto math is float32 here")
    bf16, log = _digits(tmp_path, "auto")
    fp32, log32 = _digits(tmp_path, "float32")
    assert "does its matrix math in bfloat16" in log and "matrix math in bfloat16" not in log32
    reliability("digits.py sync, 1 ps + 2 workers: test accuracy, bfloat16 math", 100 * bf16, "%")
    reliability("digits.py sync, 1 ps + 2 workers: test accuracy, float32 math", 100 * fp32, "%")
    # 360 test images: one point is 3.6 images. The bench measures the difference over repeats (README).
    assert bf16 >= 0.95 and abs(bf16 - fp32) <= 0.015, (bf16, fp32)
