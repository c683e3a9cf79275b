"""``python -m tfcluster.tf2 script.py ARGS...``: run a TF 2.0-2.15 ``tf.distribute`` program unchanged on TF 2.21.

Also ``python -m tfcluster.tf2 -m package.module ARGS...``. The script runs as
``__main__`` with ``sys.argv = [script.py, ARGS...]`` after TF2 mode is
installed (see the package docstring and docs/tf2.md). Exit codes: the
script's own; 2 for bad usage, a strategy TF 2.21 cannot build as asked here,
a Keras 2 name Keras 3 lacks or TensorBoard missing (:mod:`.keras3`); 3 when a trainer of the
all-reduce group is gone (:mod:`.faults`); each said in one line, no
traceback. tfcluster's own errors exit with their code.
"""

import sys

from ..core.errors import TfclusterError
from ..core.exits import EXIT_USAGE, run_as_main
from ..core.logs import setup_program_logging
from ..core.programs import Program, asked_for_help, fail

USAGE = "usage: python -m tfcluster.tf2 SCRIPT.py [ARGS...] | -m MODULE [ARGS...]"


def _one_line_cause(error):
    """``(line, exit code)`` of the TfclusterError in ``error``'s chain (a strategy argument refused, say), of
    a trainer lost to the all-reduce group (:mod:`.faults`), or of a Keras 2 name Keras 3 lacks (:mod:`.keras3`);
    None: the traceback is the program's."""
    from .faults import lost_peer_line
    from .keras3 import keras3_line, tensorboard_line
    seen, first = set(), error
    while error is not None and id(error) not in seen:          # the error and those it was raised from
        seen.add(id(error))
        if isinstance(error, TfclusterError):
            return str(error), error.exit_code
        lost = lost_peer_line(error)
        if lost is not None:
            return lost
        error = error.__cause__ or error.__context__
    return tensorboard_line(first) or keras3_line(first)


def main(argv=None) -> int:
    """Run a TF 2 program or module in TF2 mode; returns its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if asked_for_help(argv, USAGE, __doc__):
        return 0
    try:
        program = Program.parse(argv, USAGE)
    except TfclusterError as e:
        return fail(str(e), e.exit_code)
    setup_program_logging()
    from . import install
    try:
        install()
    except ImportError as e:
        return fail(f"cannot import TensorFlow for TF2 mode: {e}", EXIT_USAGE)
    return program.run(_one_line_cause)


if __name__ == "__main__":
    run_as_main(main)
