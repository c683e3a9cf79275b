"""The checks every parameter of a count, a duration, a choice or a switch goes through, so each says the same
thing the same way, whether it comes from an argument or from a ``TFCLUSTER_*`` variable.

Each raises a :class:`~tfcluster.core.errors.SpecError` that names the
parameter as ``{name}``, so the library says ``max_restarts must be ...`` and
the CLI ``--max-restarts must be ...``.
"""

from typing import Optional, Sequence

from .errors import SpecError

#: How a switch read from the environment says on, and off (any case); empty or unset is its default.
SWITCH_ON = ("1", "true", "yes", "on")
SWITCH_OFF = ("0", "false", "no", "off")


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


def switch_from(variable, default: bool, environ=None) -> bool:
    """A ``TFCLUSTER_*`` variable read as on or off (:data:`SWITCH_ON`, :data:`SWITCH_OFF`): ``default`` when it is
    unset or empty, one line naming it when it is anything else. The one policy for every switch: ``0`` is off
    (``TFCLUSTER_DEBUG=0`` turned debugging on when any value counted), and a typo stops the run."""
    text = (variable.get(environ) or "").strip()
    if not text:
        return default
    if text.lower() in SWITCH_ON:
        return True
    if text.lower() in SWITCH_OFF:
        return False
    raise SpecError(f"{variable.name}={text!r} must be 1 or 0 (or {'/'.join(SWITCH_ON[1:])}, "
                    f"{'/'.join(SWITCH_OFF[1:])})")


def choice_from(name: str, value, variable, choices: Sequence[str], default: str, environ=None) -> str:
    """``value`` when given, else the ``TFCLUSTER_*`` ``variable``, else ``default``: one of ``choices``, checked.

    A bad argument names its parameter (``{name}``), a bad variable names the variable: the one policy for
    every choice a strategy takes from an argument or, when the script names none, from ``tfcluster local``."""
    if value is None:
        text = (variable.get(environ) or "").strip()
        if text and text not in choices:
            raise SpecError(f"{variable.name}={text!r} must be one of {', '.join(choices)}")
        return text or default
    if value not in choices:
        raise SpecError(f"{{{name}}} must be one of {', '.join(choices)}, got {value!r}", params=[name])
    return value
