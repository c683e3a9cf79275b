"""How a launch ended: a :class:`RunResult`, from which the command's exit code comes.

As torch.distributed.elastic's agent returns a RunResult, not a number: the
exit code (tfcluster.core.exits) is one field, beside why the run ended, which
task ended it, and each task's last return code, restarts and log.
"""

import enum
from dataclasses import dataclass
from typing import Optional, Tuple

from ..core.exits import EXIT_OK
from ..topology.cluster import Task


class Ending(enum.Enum):
    """Why a launch ended."""

    SUCCEEDED = "every trainer succeeded"
    TASK_FAILED = "a task failed for good"
    TIMED_OUT = "the timeout expired"
    STOPPED = "the launcher was asked to stop"


@dataclass(frozen=True)
class TaskResult:
    """One task at the end of a launch: its last return code (None: not started or not reaped), restarts, log."""

    task: Task
    returncode: Optional[int]
    restarts: int
    log_path: str


@dataclass(frozen=True)
class RunResult:
    """A launch's end: why, its exit code, the task that ended it (if one did), every task's result."""

    ending: Ending
    exit_code: int
    failed: Optional[Task] = None
    tasks: Tuple[TaskResult, ...] = ()
    log_dir: Optional[str] = None

    @property
    def succeeded(self) -> bool:
        """True when every trainer succeeded."""
        return self.ending is Ending.SUCCEEDED and self.exit_code == EXIT_OK

    def closing_line(self) -> str:
        """The run's last line: how it ended, with restarts and where the logs are when it did not succeed."""
        restarted = ", ".join(f"{r.task} {r.restarts}" for r in self.tasks if r.restarts)
        restarts = f"; restarts: {restarted}" if restarted else ""
        if self.succeeded:
            trainers = sum(1 for r in self.tasks if r.task.ends_the_run)
            return f"done: {trainers} trainer(s) succeeded{restarts}"
        why = f"{self.failed} failed for good" if self.failed is not None else self.ending.value
        logs = f"; logs: {self.log_dir}" if self.log_dir else ""
        return f"ended: {why} (exit code {self.exit_code}){restarts}{logs}"

    def task(self, task: Task) -> TaskResult:
        """The result of ``task`` (a :class:`Task`, or its ``job:index`` name)."""
        return next(r for r in self.tasks if r.task == task or str(r.task) == str(task))
