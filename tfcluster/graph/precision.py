"""bfloat16 math where the CPU has it: oneDNN's automatic mixed precision for a model's matrix work.

x86 CPUs with AVX512-BF16 (or AMX) multiply bfloat16 matrices at about twice
the float32 rate. TF's grappler pass ``auto_mixed_precision_onednn_bfloat16``
rewrites a graph's matrix products and convolutions, and the elementwise ops
between them, to bfloat16, with casts at the edges; variables, their updates
and optimizer state stay float32 (the pass never changes a variable's type).
Measured on 2 cores (one thread, graph mode; scripts/bench.py, B5 and B6):
with AVX512-BF16 and AMX the 5.8M-parameter MLP trained 1.54 times as many
examples a second and the tutorials' CNN 1.81 times; with AVX512-BF16 alone
1.71 and 1.35 (2026-12-02), 1.67 and 1.60 (2026-12-06, docs/embeddings.md).

``math`` (``tfcluster local --math``, :data:`MATH_ENV`): ``"auto"`` (the
default) turns it on where ``/proc/cpuinfo`` lists ``avx512_bf16`` or
``amx_bf16`` and oneDNN is on (``TF_ENABLE_ONEDNN_OPTS`` is not 0);
``"bfloat16"`` asks for it anyway, ``"float32"`` never. A session config that
sets the pass itself, on or off, is kept as it is. :func:`configure` is called
on every session tfcluster makes for a trainer (fit, the Estimator, Keras) and
in TF1 mode on the program's own sessions.

bfloat16 keeps 8 bits of mantissa: results differ from float32 in the third
significant digit. The test suite compares distributed training with one
process exactly, so it runs in float32 (tests/conftest.py); the accuracy of
the README example and the click-through example with and without it is
measured (README, Benchmarks; docs/embeddings.md).

TensorFlow is imported lazily, so importing this module stays cheap.
"""

import os
from typing import Optional

from ..core import environment
from ..core.checks import choice_from

#: What ``math=`` takes.
MATHS = ("auto", "bfloat16", "float32")

#: Environment variable giving ``math`` when none is given (``tfcluster local --math``).
MATH_ENV = environment.MATH.name

#: ``/proc/cpuinfo`` flags of CPUs that multiply bfloat16 in hardware.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset:
    """The CPU's feature flags, as the first ``flags`` line of ``cpuinfo`` lists them (none where it has none)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_bfloat16(flags=None) -> bool:
    """True where the CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX) and oneDNN's kernels are on."""
    flags = cpu_flags() if flags is None else flags
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1").strip() not in ("0", "false", "False")
    return onednn and any(f in flags for f in BF16_FLAGS)


def resolve_math(math: Optional[str] = None, flags=None) -> str:
    """``"bfloat16"`` or ``"float32"``: ``math`` (None: ``TFCLUSTER_MATH``, else ``"auto"``) for this CPU."""
    math = choice_from("math", math, environment.MATH, MATHS, "auto")
    if math == "auto":
        return "bfloat16" if cpu_has_bfloat16(flags) else "float32"
    return math


def configure(config, math: Optional[str] = None, *, target="") -> object:
    """``config`` (a ``ConfigProto``, changed in place and returned) with bfloat16 math on where ``math`` resolves
    to it, unless the config sets the pass itself; ``target``: the session's (``""`` for one in this process)."""
    from tensorflow.core.protobuf import rewriter_config_pb2
    toggle = rewriter_config_pb2.RewriterConfig
    options = config.graph_options.rewrite_options
    if options.auto_mixed_precision_onednn_bfloat16 == toggle.DEFAULT and resolve_math(math) == "bfloat16":
        options.auto_mixed_precision_onednn_bfloat16 = toggle.ON
        # On a task server (a grpc:// target) the remapper's _FusedConv2D gets TF's own kernel, which has
        # no bfloat16 ("Value for attr 'T' of bfloat16 is not in the list of allowed values"; in one process
        # oneDNN's takes it). Unfused, each op has a bfloat16 kernel; the MLP's fused matmuls lost nothing
        # measurable when unfused (9,260 vs 9,500 examples/s, one run each). One process keeps the fusions.
        if _remote(target) and options.remapping == toggle.DEFAULT:
            options.remapping = toggle.OFF
    return config


def _remote(target) -> bool:
    text = target.decode() if isinstance(target, bytes) else str(target or "")
    return bool(text) and not text.startswith("local")


def is_on(config) -> bool:
    """True when ``config`` turns bfloat16 math on."""
    from tensorflow.core.protobuf import rewriter_config_pb2
    return config.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 == \
        rewriter_config_pb2.RewriterConfig.ON
