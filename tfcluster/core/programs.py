"""A program run in one of tfcluster's modes: its command rewritten, and the program run as ``__main__``.

TF1 mode (``python -m tfcluster.tf1``) and TF2 mode (``python -m tfcluster.tf2``)
run a user's script unchanged after installing what the mode serves; both turn
``python [OPTIONS] script.py ARGS`` into ``python [OPTIONS] -m <mode> script.py
ARGS`` for ``--tf1`` / ``--tf2`` and run the script as ``python script.py``
would. What they share lives here, below both.
"""

import os
import runpy
import sys
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .errors import TfclusterError

#: Python's own options that take a value (``-W ignore``): skipped when looking for the script.
PY_OPTS_WITH_ARG = {"-W", "-X", "-Q"}


def is_python(word: str) -> bool:
    """True for a Python interpreter's name: ``python``, ``python3.11``, this interpreter's path."""
    base = os.path.basename(word)
    if word == sys.executable:
        return True
    return base == "python" or (base.startswith("python") and base[6:].replace(".", "").isdigit())


def mode_command(command: Sequence[str], module: str, flag: str, extra: Sequence[str] = ()) -> list:
    """``python [OPTS] script.py ARGS`` as ``python [OPTS] -m module [extra] script.py ARGS``.

    A command already in that mode is returned as it is; anything that is not a
    Python script or ``-m package.module`` raises TfclusterError naming ``flag``.
    """
    command = list(command)
    if not command or not is_python(command[0]):
        got = command[0] if command else "nothing"
        raise TfclusterError(f"{flag} runs Python scripts: the command must be 'python script.py ...' (got {got!r})")
    i = 1
    while i < len(command) and command[i].startswith("-") and command[i] not in ("-", "-m", "-c"):
        i += 2 if command[i] in PY_OPTS_WITH_ARG else 1
    if i >= len(command) or command[i] in ("-", "-c"):
        raise TfclusterError(f"{flag} needs a script or '-m module' after python, not "
                             + (repr(command[i]) if i < len(command) else "nothing"))
    if command[i] == "-m" and command[i + 1:i + 2] == [module]:
        return command
    return command[:i] + ["-m", module] + list(extra) + command[i:]


@dataclass(frozen=True)
class Program:
    """What ``python -m <mode> ...`` was asked to run: a script or a module, and its arguments."""
    script: Optional[str]
    module: Optional[str]
    args: tuple

    @classmethod
    def parse(cls, argv: Sequence[str], usage: str) -> "Program":
        """``SCRIPT.py ARGS...`` or ``-m MODULE ARGS...``; a TfclusterError (exit 2) names what is wrong."""
        argv = list(argv)
        if not argv:
            raise TfclusterError(f"no script given; {usage}")
        if argv[0] == "-m":
            if len(argv) < 2:
                raise TfclusterError(f"-m needs a module name; {usage}")
            return cls(None, argv[1], tuple(argv[2:]))
        if not os.path.isfile(argv[0]):
            raise TfclusterError(f"no such script: {argv[0]}")
        return cls(argv[0], None, tuple(argv[1:]))

    @property
    def name(self) -> str:
        """How logs name it: the script's file name, or the module's."""
        return os.path.basename(self.script) if self.script is not None else self.module

    def run(self, one_line: Callable = lambda error: None) -> int:
        """Run it as ``__main__`` as ``python script.py ARGS`` (or ``python -m module``) would; 0 when it returns.

        ``one_line(error)`` -> ``(line, exit code)`` or None: an error the mode
        says in one line instead of a traceback (None re-raises it).
        """
        try:
            self._run()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - only what one_line names becomes one line; the rest re-raise
            cause = one_line(e)
            if cause is None:
                raise
            return fail(*cause)
        return 0

    def _run(self):
        if self.module is not None:
            sys.argv = [self.module, *self.args]
            runpy.run_module(self.module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [self.script, *self.args]
            # As `python script.py` does: the script's directory comes first on sys.path.
            sys.path[0] = os.path.dirname(os.path.abspath(self.script))
            runpy.run_path(self.script, run_name="__main__")


def asked_for_help(argv: Sequence[str], usage: str, doc: str) -> bool:
    """True (after printing ``usage`` and the body of the mode's docstring ``doc``) when ``argv`` asks for help."""
    if list(argv[:1]) not in (["-h"], ["--help"]):
        return False
    print(usage)
    print(doc.split("\n\n", 1)[1].strip())
    return True


def fail(message: str, code: int) -> int:
    """Say ``message`` on stderr as tfcluster's one line (``tfcluster: error: ...``); returns ``code``."""
    sys.stderr.write(f"tfcluster: error: {message}\n")
    sys.stderr.flush()
    return code
