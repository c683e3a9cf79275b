"""How tfcluster's own log lines look, in each place they are shown.

The library logs through the ``tfcluster`` logger and never configures it;
the programs do, here:

- the CLI: ``HH:MM:SS tfcluster: message`` on stderr (:func:`setup_cli_logging`);
- the local launcher: ``[tfcluster] message`` lines among its tasks' prefixed
  lines, errors on stderr (:func:`use_prefixed_logging`);
- TF1 and TF2 mode: ``tfcluster: info: message``, the shape of the CLI's one-line
  errors, unless the script set up the logger itself (:func:`setup_program_logging`);
  and the script's own ``tf.logging`` lines once each, in the format it chose
  (:func:`tensorflow_lines_once`), without tf-keras's thread notice
  (:func:`quiet_keras_thread_notice`, also under :func:`tfcluster.keras.fit`).

``TFCLUSTER_DEBUG=1`` shows debug lines everywhere.
"""

import logging
import sys

from . import environment
from .checks import switch_from

log = logging.getLogger("tfcluster")


class _LevelPrefix(logging.Filter):
    """Adds ``level_``: empty for INFO and below, ``warning: ``/``error: `` above."""

    def filter(self, record):
        record.level_ = "" if record.levelno <= logging.INFO else record.levelname.lower() + ": "
        return True


def debug_wanted(verbose: bool = False) -> bool:
    """True when debug lines were asked for (``verbose``, or the switch TFCLUSTER_DEBUG on in the environment)."""
    return verbose or switch_from(environment.DEBUG, False)


def _install(handler, level):
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def setup_cli_logging(verbose: bool = False):
    """Log lines as ``HH:MM:SS tfcluster: message`` on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_LevelPrefix())
    handler.setFormatter(logging.Formatter("%(asctime)s tfcluster: %(level_)s%(message)s", "%H:%M:%S"))
    _install(handler, logging.DEBUG if debug_wanted(verbose) else logging.INFO)


def setup_program_logging():
    """``tfcluster: warning: message`` on stderr, unless the ``tfcluster`` logger already has a handler."""
    if log.handlers:
        return

    class _LevelName(logging.Filter):
        def filter(self, record):
            record.level_name = record.levelname.lower()
            return True
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_LevelName())
    handler.setFormatter(logging.Formatter("tfcluster: %(level_name)s: %(message)s"))
    _install(handler, logging.DEBUG if debug_wanted() else logging.INFO)


class _ShownByRoot(logging.Filter):
    """On TensorFlow's own handler: drops a record that a handler of the root logger shows as well."""

    def filter(self, record):
        if not logging.getLogger("tensorflow").propagate:
            return True
        return not any(record.levelno >= h.level for h in logging.getLogger().handlers)


def tensorflow_lines_once():
    """One line per ``tf.logging`` message: the ``tensorflow`` logger's handlers yield to the root logger's.

    TensorFlow gives its logger a handler of its own when the root logger has
    none yet. absl's ``app.run`` (``tf.app.run``) then puts absl's handler on
    the root logger, and each message showed twice, in TF's format and in
    absl's. The program's choice wins: absl's (or any root handler's) format
    once it has one, TF's otherwise. Call it once TF's logger exists.
    """
    for handler in logging.getLogger("tensorflow").handlers:
        if not any(isinstance(f, _ShownByRoot) for f in handler.filters):
            handler.addFilter(_ShownByRoot())


class _NotKerasThreadNotice(logging.Filter):
    def filter(self, record):
        return not str(record.msg).startswith("OMP_NUM_THREADS is no longer used by the default TF-Keras config")


def quiet_keras_thread_notice():
    """Drop tf-keras's warning that OMP_NUM_THREADS is unused, from the ``tensorflow`` logger.

    The launcher sets OMP_NUM_THREADS for the program's OpenMP libraries
    (topology/devices.py) beside TensorFlow's own thread variables; tf-keras
    warns about it whenever it makes a session, which read as if something
    were misconfigured.
    """
    logger = logging.getLogger("tensorflow")
    if not any(isinstance(f, _NotKerasThreadNotice) for f in logger.filters):
        logger.addFilter(_NotKerasThreadNotice())


class PrefixedLogHandler(logging.Handler):
    """Sends log records as ``[tfcluster] ...`` lines through a writer (anything with ``line(text)``)."""

    def __init__(self, writer, prefix: str = "[tfcluster] ", error_writer=None):
        super().__init__()
        self.writer = writer
        self.prefix = prefix
        self.error_writer = error_writer or writer
        self.addFilter(_LevelPrefix())

    def emit(self, record):
        """Write the record's lines, each with the prefix (errors to ``error_writer``)."""
        try:
            # Why the run failed goes to stderr: it stays on the terminal when stdout is a log file.
            writer = self.error_writer if record.levelno >= logging.ERROR else self.writer
            for part in self.format(record).splitlines() or [""]:
                writer.line(f"{self.prefix}{record.level_}{part}")
        except Exception:  # logging must never take the launcher down
            self.handleError(record)


def use_prefixed_logging(writer, debug: bool = False, error_writer=None):
    """Route the ``tfcluster`` logger to ``writer`` as ``[tfcluster]`` lines (errors to ``error_writer``)."""
    handler = PrefixedLogHandler(writer, error_writer=error_writer)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = logging.DEBUG if debug_wanted(debug) else (log.level or logging.INFO)
    _install(handler, level)
