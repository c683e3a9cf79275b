"""``python -m tfcluster.tf1 script.py ARGS...``: run a TF 1.x script unchanged on TF 2.21.

Also ``python -m tfcluster.tf1 -m package.module ARGS...``. The script runs as
``__main__`` with ``sys.argv = [script.py, ARGS...]``, after TF1 mode is
installed (see the package docstring and docs/tf1.md). With
``--session-fixes-only`` first, ``import tensorflow`` stays TensorFlow 2 and only
TF1 mode's fixes to sessions apply (for scripts that import
``tensorflow.compat.v1`` themselves; ``tfcluster local --legacy-flags`` runs
Python scripts this way).

Exit codes: the script's own; 2 for a TF 1.x name that TF 2.21 no longer has
(one line naming the replacement), for missing MNIST files, for tf.layers
without tf-keras, and for bad usage; tfcluster's own errors exit with their
code (:mod:`tfcluster.core.exits`: 3 for a peer lost, such as a sync step
stalled for good).
"""

import os
import sys

from ..core import duplicates
from ..core.errors import TfclusterError
from ..core.exits import EXIT_USAGE, run_as_main
from ..core.logs import setup_program_logging
from ..core.programs import Program, asked_for_help, fail
from . import SESSION_FIXES_ONLY

USAGE = "usage: python -m tfcluster.tf1 [--session-fixes-only] SCRIPT.py [ARGS...] | -m MODULE [ARGS...]"
_KERAS3_MARK = "is not available with Keras 3"


def _one_line_cause(error):
    """``(line, exit code)`` of the error in the chain that deserves one clear line instead of a traceback."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, TfclusterError):       # TF1RemovedError among them (exit 2)
            return str(error), error.exit_code
        if isinstance(error, AttributeError) and _KERAS3_MARK in str(error):
            symbol = str(error).split("`")[1] if str(error).count("`") >= 2 else "this layer"
            return (f"tf.layers ({symbol}) needs the tf-keras package on TF 2.21 (Keras 3 has no graph-mode "
                    f"layers): pip install tf-keras==2.21.0"), EXIT_USAGE
        if isinstance(error, ValueError) and _raised_in(error, _FEATURE_COLUMNS):
            # TF's feature columns check their arguments (a bucket count below 1, a dimension of 0) as the
            # script builds them: the script's line and TF's message say it all.
            return f"{_script_line(error)}{error}", EXIT_USAGE
        error = error.__cause__ or error.__context__
    return None


#: Where TF's feature columns live: their argument checks become one line naming the script's line.
_FEATURE_COLUMNS = os.path.join("tensorflow", "python", "feature_column") + os.sep


def _raised_in(error, where: str) -> bool:
    """True when ``error`` was raised inside a file whose path contains ``where``."""
    import traceback
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and where in frames[-1].filename


def _script_line(error) -> str:
    """``train.py:12: `` for the script's own innermost frame of ``error`` (empty if none)."""
    import traceback
    mine = [f for f in traceback.extract_tb(error.__traceback__)
            if "site-packages" not in f.filename and os.sep + "tfcluster" + os.sep not in f.filename
            and not f.filename.startswith("<")]
    return f"{os.path.basename(mine[-1].filename)}:{mine[-1].lineno}: " if mine else ""


def main(argv=None) -> int:
    """Run a TF1 script or module in TF1 mode; returns its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if asked_for_help(argv, USAGE, __doc__):
        return 0
    fixes_only = argv[:1] == [SESSION_FIXES_ONLY]
    try:
        program = Program.parse(argv[1:] if fixes_only else argv, USAGE)
    except TfclusterError as e:
        return fail(str(e), e.exit_code)
    setup_program_logging()

    from . import install, install_session_fixes
    try:
        if fixes_only:
            from ..topology.taskenv import import_tensorflow
            import_tensorflow()
            install_session_fixes()
        else:
            install()
    except ImportError as e:
        return fail(f"cannot import TensorFlow for TF1 mode: {e}", EXIT_USAGE)
    except TfclusterError as e:         # a TFCLUSTER_* setting TF1 mode reads, say
        return fail(str(e), e.exit_code)
    try:
        return program.run(_one_line_cause)
    finally:
        duplicates.say_met(program.name)


if __name__ == "__main__":
    run_as_main(main)
