"""The evaluator task's loop: evaluate the checkpoints training writes, until its last one, bounded.

The evaluator runs outside the cluster (nobody waits for it, pitfalls item
12) and reads the chief's checkpoint dir. ``fit``'s evaluator evaluates every
new checkpoint in turn; TF 1.x's ``train_and_evaluate`` evaluates the newest
one when due (``start_delay_secs`` after the start, then at most every
``throttle_secs``). Both end once the final checkpoint is evaluated: the one
the chief's done marker names, or one that reaches ``final_step``. Each
checkpoint is read from hard links to its files, so the chief's rotation
cannot delete it mid-read; one that vanished before it was linked, or cannot
be read (cut short), is skipped with a warning; with no new checkpoint and no done marker for
``timeout_secs``, the evaluator gives up in one line.
"""

import logging
import os
import time
from typing import Callable, Optional

from ..core.errors import TfclusterError
from ..runtime.checkpoints import (CheckpointUnreadable, checkpoint_exists, checkpoint_step, checkpoints_in,
                                   pinned, read_done_marker)

log = logging.getLogger("tfcluster")

#: The evaluator gives up after this long without a new checkpoint or the chief's done marker.
EVALUATOR_TIMEOUT_SECS = 600.0


def _final(checkpoint_dir: str, done: Optional[dict], listed: list) -> Optional[str]:
    """The chief's last checkpoint, once its done marker is written: the one it names, else the newest."""
    if done is None:
        return None
    named = done.get("checkpoint")
    if named:
        return named if os.path.isabs(named) else os.path.join(checkpoint_dir, named)
    return listed[-1] if listed else None


def watch_checkpoints(checkpoint_dir: str, evaluate: Callable, *, timeout_secs: float = EVALUATOR_TIMEOUT_SECS,
                      poll_secs: float = 1.0, newest_only: bool = False, start_delay_secs: float = 0.0,
                      throttle_secs: float = 0.0, final_step: Optional[int] = None):
    """Call ``evaluate(path, final)`` on the checkpoints of ``checkpoint_dir`` until the final one (module doc)."""
    log.info("evaluator watches %s (gives up after %gs without a new checkpoint)", checkpoint_dir, timeout_secs)
    started = last_news = time.monotonic()
    last_evaluation = None
    seen = set()        # evaluated, skipped, or passed over for a newer one
    while True:
        done = read_done_marker(checkpoint_dir)
        listed = checkpoints_in(checkpoint_dir)
        final = _final(checkpoint_dir, done, listed)
        fresh = [p for p in listed if p not in seen]
        if fresh:
            last_news = time.monotonic()
        for path in (fresh[-1:] if newest_only else fresh):
            reaches = final_step is not None and (checkpoint_step(path) or 0) >= final_step
            is_final = path == final or reaches
            now = time.monotonic()
            due = not newest_only or (now - started >= start_delay_secs and
                                      (last_evaluation is None or now - last_evaluation >= throttle_secs))
            if not (due or is_final):
                continue            # looked at again on the next poll, unless a newer one comes first
            seen.update(fresh if newest_only else [path])
            if _evaluated(path, evaluate, is_final):
                last_evaluation = time.monotonic()
            if reaches:
                final = path
        if (final is not None and final in seen) or (done is not None and not listed):
            log.info("evaluator: training is done (global step %s); exiting",
                     done.get("global_step") if done else checkpoint_step(final))
            return
        if time.monotonic() - last_news > timeout_secs:
            raise TfclusterError(f"evaluator: no new checkpoint in {checkpoint_dir} for {timeout_secs:g}s "
                                 "and no done marker; is training running?")
        time.sleep(poll_secs)


def _evaluated(path: str, evaluate: Callable, final: bool) -> bool:
    """Evaluate ``path`` (its files pinned, :func:`~tfcluster.runtime.checkpoints.pinned`); False, with a warning,
    when it vanished or cannot be read."""
    if not checkpoint_exists(path):
        log.warning("evaluator: skipped %s: it was rotated away before it was read", os.path.basename(path))
        return False
    try:
        with pinned(path) as readable:     # the chief's rotation cannot take it away while it is read
            evaluate(readable, final)
        return True
    except CheckpointUnreadable as e:
        reason = str(e).split(": ", 1)[-1] if "cannot be read" in str(e) else \
            "it vanished while it was read (rotated away)"
        log.warning("evaluator: skipped %s: %s", os.path.basename(path), reason)
        return False
