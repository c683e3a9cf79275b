"""``tfcluster``: the command line. It parses, calls the library, and prints.

One module per command (``start``, ``local``, ``spec``, ``status``,
``horovodrun``), each with
its options (``add_parser``) and what it does (``run``); :mod:`.common` holds
what they share. The library's errors name its parameters; :func:`main` shows
them under the command's own flags, as one line with the exit code of
:mod:`tfcluster.core.exits`.
"""

import argparse
import signal
import sys

from ..core.errors import TfclusterError
from ..core.exits import EXIT_USAGE, from_signal, run_as_main
from ..core.logs import setup_cli_logging
from ..core.tfguard import INSTALL_HINT
from ..core.version import __version__
from . import horovodrun, local, spec, start, status
from .common import add_cluster_args, cluster_from_args, environment_defaults, split_command

__all__ = ["main", "build_parser", "cluster_from_args", "add_cluster_args", "flag_names"]

COMMANDS = (start, spec, local, status, horovodrun)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``tfcluster: error: ...``."""

    def error(self, message):
        sys.stderr.write(f"tfcluster: error: {message} (see '{self.prog} --help')\n")
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    """The ``tfcluster`` argument parser with all its subcommands."""
    p = _Parser(prog="tfcluster", description="Run graph-mode TensorFlow 1 code on clusters.",
                epilog="Run 'tfcluster COMMAND --help' for a command's options.")
    p.add_argument("--version", action="version", version=f"tfcluster {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    for command in COMMANDS:
        sp = command.add_parser(sub)
        sp.set_defaults(parser=sp)    # its flags name the library's parameters in errors (main)
    return p


def flag_names(parser) -> dict:
    """``{parameter name: flag}`` for a command's options: its dest, and each long option's own name."""
    names = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs:
            continue
        preferred = "--" + action.dest.replace("_", "-")
        names.setdefault(action.dest, preferred if preferred in longs else longs[0])
        for o in longs:
            names.setdefault(o[2:].replace("-", "_"), o)
    # The launch config's isolate is the negation of the flag that turns it off.
    if "no_isolate" in names:
        names["isolate"] = names["no_isolate"]
    return names


def _subcommand(parser, argv):
    """The subparser of the command ``argv`` names, and where its own words start (None: no such command)."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for i, word in enumerate(argv):
        if word == "--":
            break
        if not word.startswith("-"):
            return action.choices.get(word), i + 1
    return None, len(argv)


def _split(parser, argv):
    """``(tfcluster's own words, the command)``; a command's options from ``TFCLUSTER_*`` become its defaults."""
    sub, start = _subcommand(parser, argv)
    if sub is None:
        if "--" in argv:
            i = argv.index("--")
            return argv[:i], argv[i + 1:]
        return argv, []
    if getattr(sub, "reads_environment", False):
        sub.set_defaults(**environment_defaults(sub))
    own, command = split_command(sub, argv[start:], getattr(sub, "script_interpreter", None))
    return argv[:start] + own, command


def _tensorflow_missing(e: ModuleNotFoundError) -> bool:
    return (e.name or "").split(".")[0] == "tensorflow"


def main(argv=None) -> int:
    """Entry point of the ``tfcluster`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        own, command = _split(parser, argv)
    except TfclusterError as e:
        print(f"tfcluster: error: {e}", file=sys.stderr)
        return e.exit_code
    args = parser.parse_args(own)
    if args.cmd is None:
        parser.print_help()
        return EXIT_USAGE
    args.command = command
    if command and args.cmd == "status":
        parser.error("status takes no command after --")
    setup_cli_logging()
    try:
        return args.func(args)
    except TfclusterError as e:
        print(f"tfcluster: error: {e.naming(flag_names(args.parser))}", file=sys.stderr)
        return e.exit_code
    except ModuleNotFoundError as e:
        # A backstop: every command checks first where it knows it needs TensorFlow (tfcluster.core.tfguard).
        if not _tensorflow_missing(e):
            raise
        print(f"tfcluster: error: TensorFlow is not installed; {INSTALL_HINT}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return from_signal(signal.SIGINT)


def run():
    """The ``tfcluster`` console script: :func:`main`, then the exit (quick once a ps imported TensorFlow)."""
    run_as_main(main)


if __name__ == "__main__":
    run()
