""""Every N steps or every S seconds": one timer for every hook that acts periodically (TF's SecondOrStepTimer).

Checkpoints, summaries, progress and metric lines, the Estimator's step log:
each asks :meth:`Every.due` after a step and calls :meth:`Every.mark` when it
acted (or tried to: a save that failed is tried again a period later, not
after every step).
"""

import time
from typing import Callable, Optional


class Every:
    """Due every ``steps`` steps or every ``secs`` seconds since the last mark, whichever comes first.

    Either may be None (never by that measure); ``steps`` 0 is never too,
    ``secs`` 0 is after every step. ``at_first``: due before the first mark
    too (the first step's summary, the first timeline mark).
    """

    def __init__(self, steps: Optional[int] = None, secs: Optional[float] = None, at_first: bool = False,
                 clock: Callable[[], float] = time.monotonic):
        self.steps, self.secs, self.at_first, self.clock = steps, secs, at_first, clock
        self.last_step: Optional[int] = None
        self.last_time = clock()

    def due(self, step: int) -> bool:
        """True when ``step`` is a period past the last mark (or it is the first, with ``at_first``)."""
        if self.last_step is None:
            return self.at_first
        return bool((self.steps and step - self.last_step >= self.steps)
                    or (self.secs is not None and self.clock() - self.last_time >= self.secs))

    def mark(self, step: int):
        """The action happened (or was tried) at ``step``, now: the next period counts from here."""
        self.last_step, self.last_time = step, self.clock()
