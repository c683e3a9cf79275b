"""The checks every parameter of a count or a duration goes through, so each says the same thing the same way.

Each raises a :class:`~tfcluster.core.errors.SpecError` that names the
parameter as ``{name}``, so the library says ``max_restarts must be ...`` and
the CLI ``--max-restarts must be ...``.
"""

from typing import Optional

from .errors import SpecError


def whole_number(name: str, value, minimum: int = 0, optional: bool = False) -> Optional[int]:
    """``value`` when it is a whole number >= ``minimum`` (or None, when ``optional``); else one line naming ``name``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"{{{name}}} must be a whole number >= {minimum}, got {value!r}", params=[name])
    return value


def seconds(name: str, value, positive: bool = True, optional: bool = False) -> Optional[float]:
    """``value`` when it is a number of seconds > 0 (>= 0 unless ``positive``; None when ``optional``)."""
    if value is None and optional:
        return None
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or value != value
    if bad or (value <= 0 if positive else value < 0):
        what = "a positive number of seconds" if positive else ">= 0 seconds"
        raise SpecError(f"{{{name}}} must be {what}, got {value!r}", params=[name])
    return float(value)


def seconds_from(variable, default: float, environ=None) -> float:
    """A ``TFCLUSTER_*`` variable (:mod:`tfcluster.core.environment`) read as a positive number of seconds:
    ``default`` when it is unset or empty, one line naming it when it is anything else. The one policy for
    every duration read from the environment: a typo stops the run, it is not replaced by the default."""
    text = (variable.get(environ) or "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise SpecError(f"{variable.name}={text!r} must be a positive number of seconds")
    return value
