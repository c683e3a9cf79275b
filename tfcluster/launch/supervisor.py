"""Supervision: start the planned tasks, watch them, restart the ones that crash, end the run.

The run ends once the trainers (the workers and the chief) have exited: TF1
ps tasks never end by themselves (docs/pitfalls.md, item 2), so the launcher
stops them, and gives the evaluator a grace period to finish. Exit codes of
:meth:`LocalLauncher.run` (:mod:`tfcluster.core.exits`): 0 when every trainer
succeeded; otherwise the code of the first trainer that failed for good
(128+N when it died of signal N), or of a ps that died and could not be
restarted (137 for a ps the kernel killed for memory, named as such under
``ps_memory``); 124 when the timeout expired; 128+N when the launcher itself got
signal N (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP). :meth:`LocalLauncher.launch` returns the
code in a :class:`~tfcluster.launch.result.RunResult`, with why the run ended and how each task did.
"""

import logging
import os
import signal
import threading
import time
from typing import Optional

from ..core import posix
from ..core.exits import EXIT_OK, EXIT_TIMEOUT, describe_exit, exit_status, from_signal
from ..topology.cluster import Role
from .config import LaunchConfig
from .isolation import isolate_launch
from .memory import MemoryLimits, ps_memory_limits
from .output import LineWriter, failure_cause
from .plan import PS_STATE_FILE, make_log_dir, plan_resources, plan_tasks, planned_tasks
from .processes import TaskGroup, fork_tf1_tasks, start_tasks
from .restarts import Restarts
from .result import Ending, RunResult, TaskResult

log = logging.getLogger("tfcluster")

#: A task's port placeholder is dropped once the task answers, or after this long.
PORT_HOLD_LIMIT = 300.0
_POLL = 0.05


class LocalLauncher:
    """Runs one local cluster: starts, supervises, restarts and stops its tasks; see the module doc."""

    def __init__(self, config: LaunchConfig, writer: Optional[LineWriter] = None):
        self.config = config
        self.writer = writer or LineWriter(timestamps=config.timestamps)
        self.isolated = False
        self.cluster = None
        self.procs = []
        self.memory: Optional[MemoryLimits] = None     # the ps tasks' memory cgroups (ps_memory)
        self.shutdown_seconds: Optional[float] = None   # last trainer exit -> last task process gone
        self._signals = []
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._chief_done_at: Optional[float] = None
        self._deadline: Optional[float] = None          # --timeout's end (monotonic)
        self._join_hinted = False
        self.group = TaskGroup(self.procs, config.subreaper, self._signals)
        self.restarts = Restarts(config, self.writer, self.group, self._lock)

    # ----------------------------------------------------------- running
    def run(self) -> int:
        """Start the cluster, supervise it until the trainers are done, stop it, say how it ended; return the
        exit code."""
        result = self.launch()
        log.info("%s", result.closing_line())
        return result.exit_code

    def launch(self) -> RunResult:
        """As :meth:`run`, returning how the run ended (:class:`RunResult`)."""
        # Resources first: asking for more GPUs than there are is refused before anything is made.
        resources, devices_line = plan_resources(self.config)
        # The memory cgroups before anything else is made: one that cannot be made is then the only line,
        # and leaves nothing behind.
        with ps_memory_limits(self.config.ps_memory, planned_tasks(self.config)) as self.memory:
            return self._run(resources, devices_line)

    def _run(self, resources, devices_line) -> RunResult:
        # Isolation before anything is made (required isolation that fails leaves nothing), said after
        # the log dir, whose failure is then the only line.
        self.isolated, isolation = isolate_launch(self.config)
        log_dir = make_log_dir(self.config.log_dir)
        log.info("%s", isolation)
        for line in posix.missing_features():
            log.info("platform: %s", line)
        log.info("logs: %s (one file per task)", log_dir)
        log.info("run: %s (a Keras fit's default checkpoints are the run's; --run-id %s resumes them)",
                 self.config.run_id, self.config.run_id)
        log.info("%s", devices_line)
        if self.config.subreaper:
            self.group.become_subreaper()
        previous = posix.take_signals(lambda signum, _frame: self._signals.append(signum))
        watcher = None
        try:
            self.cluster, procs = plan_tasks(self.config, log_dir, resources)
            self.procs.extend(procs)
            if self.memory is not None:
                self.memory.place(self.procs, os.path.join(log_dir, PS_STATE_FILE))
            self.group.forks = fork_tf1_tasks(self.procs, log_dir) if self.config.fork_tf1 else None  # before the ps
            log.info("cluster: %s", ", ".join(f"{t} {self.cluster.address(t)}" for t in self.cluster.tasks()))
            # --timeout counts from here: a TF1 run's tasks may wait for the fork server's import.
            self._deadline = None if self.config.timeout is None else time.monotonic() + self.config.timeout
            start_tasks(self.procs, self.writer, self._stopping)
            watcher = threading.Thread(target=self._release_ports_when_up, name="tfcluster-ports", daemon=True)
            watcher.start()
            end = self._supervise()
        finally:
            self._finished.set()
            self.group.stop()
            self.group.sweep_adopted()
            # Every process is gone, so each pipe ends as soon as its reader
            # catches up; on a loaded machine that can take more than a
            # second, and closing early lost a task's last lines.
            drained_by = time.monotonic() + 10.0
            for p in self.procs:
                p.drain(max(0.1, drained_by - time.monotonic()))
                p.close()
            if watcher is not None:
                watcher.join(2.0)
            posix.give_back_signals(previous)
        ending, code, failed = end
        return RunResult(ending, code, failed, log_dir=log_dir, tasks=tuple(
            TaskResult(p.task, p.poll(), p.restarts, p.log_path) for p in self.procs))

    def _supervise(self) -> tuple:
        """``(Ending, exit code, the task that ended the run or None)``."""
        trainers = [p for p in self.procs if p.is_trainer]
        last_look = 0.0
        while True:
            end = self._check_interrupts(self._deadline)
            if end is not None:
                return end
            now = time.monotonic()
            if now - last_look > 0.5:
                for p in self.procs:
                    p.remember_descendants()
                self.group.sweep_adopted(stop=False)
                last_look = now
            for p in self.procs:
                if not p.running or p.poll() is None:
                    continue
                code = self._on_exit(p)
                if code is not None:
                    return Ending.TASK_FAILED, code, p.task
            if all(p.returncode == 0 for p in trainers) or self._left_in_join(trainers):
                break
            if self.memory is not None:
                self.memory.sample()
            time.sleep(_POLL)
        return self._finish(trainers, self._deadline)

    def _finish(self, trainers, deadline) -> tuple:
        """The trainers are done: stop the rest, give the evaluator its grace, succeed."""
        last_exit = time.monotonic()
        others = [p for p in self.procs if p.task.role is not Role.EVALUATOR]
        if any(p.running for p in others if not p.is_trainer):
            log.info("all %d trainer(s) finished; stopping %s", len(trainers),
                     ", ".join(p.name for p in others if p.running))
        self.group.stop(others)
        self.shutdown_seconds = time.monotonic() - last_exit
        log.debug("every task process was gone %.2fs after the last trainer exited", self.shutdown_seconds)
        end = self._finish_evaluator(deadline)
        if end is not None:
            return end
        return Ending.SUCCEEDED, EXIT_OK, None

    def _left_in_join(self, trainers) -> bool:
        """True once the chief finished ``join_grace`` seconds ago: the trainers still running are
        taken to be left in server.join() (in-graph TF1 scripts), and are stopped like the ps."""
        chief = next((p for p in trainers if p.task == self.cluster.chief_task), None)
        if chief is None or chief.returncode != 0:
            self._chief_done_at = None
            return False
        now = time.monotonic()
        if self._chief_done_at is None:
            self._chief_done_at = now
        running = [p.name for p in trainers if p.running]
        waited = now - self._chief_done_at
        grace = self.config.join_grace
        if grace is not None and waited >= grace:
            log.info("%s finished %.0fs ago and %s still run: taken to be left in server.join() "
                     "(--join-grace %g); stopping them", chief.name, waited, ", ".join(running), grace)
            return True
        if grace is None and waited >= 30.0 and not self._join_hinted:
            self._join_hinted = True
            # The usual causes, seen with TF 1.x scripts (docs/tf1.md): a worker whose session waits for the
            # chief's server, which exited with the chief; or a worker left in server.join().
            log.info("%s finished 30s ago; still waiting for %s. If they wait for the chief, run the script "
                     "with --tf1 or, under --legacy-flags, without --no-session-fixes; if they sit in "
                     "server.join(), --join-grace S stops them S seconds after the chief", chief.name,
                     ", ".join(running))
        return False

    def _stopping(self) -> bool:
        """True once a signal came or --timeout passed (:meth:`_check_interrupts` says which)."""
        return bool(self._signals) or self._deadline is not None and time.monotonic() >= self._deadline

    def _check_interrupts(self, deadline) -> Optional[tuple]:
        if self._signals:
            sig = self._signals[0]
            log.warning("got %s; stopping the cluster (each task has %gs to end its step and save, "
                        "--stop-grace; a second signal stops it at once); --run-id %s resumes this run",
                        signal.Signals(sig).name, self.config.stop_grace, self.config.run_id)
            return Ending.STOPPED, from_signal(sig), None
        if deadline is not None and time.monotonic() >= deadline:
            log.error("timed out after %gs (--timeout); stopping the cluster", self.config.timeout)
            return Ending.TIMED_OUT, EXIT_TIMEOUT, None
        return None

    def _on_exit(self, p) -> Optional[int]:
        """React to a task that exited; return an exit code when the run must end."""
        code = p.returncode
        # Leftovers of the task's own tree go first: a restart needs the port
        # free, and a leftover that inherited the pipe would hold the drain up.
        self.group.stop_leftovers(p)
        p.drain(1.0)
        if p.task.role is Role.EVALUATOR:
            (log.info if code == 0 else log.warning)("%s %s (log: %s)", p.name, describe_exit(code), p.log_path)
            return None
        if code == 0:
            log.info("%s finished", p.name)
            return None
        cause = failure_cause(p.tail) if code > 0 else None
        why = f" ({cause})" if cause else ""
        how = (self.memory and self.memory.killed(p.name, code)) or describe_exit(code)
        if p.restarts < self.config.max_restarts:
            # A group with a trainer already done cannot run again: that trainer's part is over.
            if p.is_trainer and self.config.trainers_restart_together and not any(
                    q.is_trainer and q.returncode == 0 for q in self.procs):
                self.restarts.trainers(p, f"{how}{why}")
            else:
                self.restarts.one(p, f"{how}{why}")
            return None
        what = "" if not self.config.max_restarts else f" after {p.restarts} restart(s)"
        log.error("%s %s%s%s; see its log: %s", p.name, how, why, what, p.log_path)
        others = [q.name for q in self.procs if q.running]
        if others:
            log.info("stopping the cluster (%s)", ", ".join(others))
        return exit_status(code)

    def _finish_evaluator(self, deadline) -> Optional[tuple]:
        evaluators = [p for p in self.procs if p.task.role is Role.EVALUATOR and p.running]
        if not evaluators:
            return None
        grace = self.config.evaluator_grace
        log.info("waiting up to %gs (--evaluator-grace) for the evaluator to finish", grace)
        end = time.monotonic() + grace
        while any(p.running for p in evaluators) and time.monotonic() < end:
            interrupted = self._check_interrupts(deadline)
            if interrupted is not None:
                return interrupted
            for p in evaluators:
                if p.running and p.poll() is not None:
                    self._on_exit(p)
            time.sleep(_POLL)
        if any(p.running for p in evaluators):
            log.info("the evaluator did not finish within %gs; stopping it", grace)
            self.group.stop(evaluators)
        return None

    # ------------------------------------------------------------- ports
    def _release_ports_when_up(self):
        """Drop each task's port placeholder once its server answers (or after PORT_HOLD_LIMIT)."""
        from ..runtime.server import TaskState, probe
        while not self._finished.wait(0.5):
            with self._lock:
                pending = [p for p in self.procs if p.placeholder is not None and p.running]
            if not pending:
                continue
            try:
                states = probe(self.cluster, [p.task for p in pending], timeout=0.5)
            except Exception as e:  # a probe failure only delays the release
                log.debug("port probe failed: %s", e)
                continue
            now = time.monotonic()
            with self._lock:
                for p in pending:
                    if states.get(p.task) is TaskState.UP:
                        log.debug("%s answers on port %d; placeholder released", p.name, p.port)
                        p.release_port()
                    elif now - p.started_at > PORT_HOLD_LIMIT:
                        log.debug("%s is not serving after %gs; port %d placeholder released",
                                  p.name, PORT_HOLD_LIMIT, p.port)
                        p.release_port()


def run_local(command, writer: Optional[LineWriter] = None, **options) -> int:
    """Run a local cluster for ``command`` (see :class:`LaunchConfig`); return its exit code."""
    return LocalLauncher(LaunchConfig(tuple(command), **options), writer=writer).run()
