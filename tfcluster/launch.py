"""The local launcher: a whole cluster on this machine from one command, supervised.

``tfcluster local --ps 1 --workers 2 -- python train.py`` is to a TF1 cluster
what torchrun is to PyTorch. It reserves one port per task, starts one process
per task in its own process group, shows every line of every task prefixed
with the task's name (``[worker:1] ...``) and keeps one log file per task,
restarts tasks that crash (``--max-restarts``), and ends the cluster once the
trainers (the workers and the chief) have exited: TF1 ps tasks never end by
themselves (pitfalls item 2), so the launcher stops them, and gives the
evaluator a grace period to finish.

TensorFlow's servers listen on every interface and run whatever graph they
are sent (pitfalls item 7). With ``isolate=True`` (the CLI's default) the
launcher first moves itself, and so every task, into a network namespace of
its own with only loopback (:func:`isolate_network`): no other host can reach
the cluster, and the cluster cannot reach the network.

Exit codes of :meth:`LocalLauncher.run`: 0 when every trainer succeeded;
otherwise the code of the first trainer that failed for good (128+N when it
died of signal N), or of a ps that died and could not be restarted; 124 when
``--timeout`` expired; 128+N when the launcher itself got signal N (130 for
Ctrl-C, 143 for SIGTERM, 129 for SIGHUP). Bad usage raises
:class:`~tfcluster.errors.TfclusterError` before anything starts.
"""

import collections
import datetime
import errno
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional

from .cluster import Cluster, Task, parse_address
from .errors import TfclusterError
from .ports import REUSE_ENV, PortReservation

log = logging.getLogger("tfcluster")

#: The jobs whose exit ends the run.
TRAINER_JOBS = ("chief", "worker")
EXIT_TIMEOUT = 124
#: Seconds between SIGTERM and SIGKILL when the launcher stops a task.
TERM_GRACE = 1.0
#: The same for a ps that tfcluster hosts: it has nothing to save, only TF's slow teardown.
HOSTED_PS_GRACE = 0.5
#: A task's port placeholder is dropped once the task answers, or after this long.
PORT_HOLD_LIMIT = 300.0
_POLL = 0.05
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


def _libc():
    """The C library, for prctl (None where there is none to load)."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True)
    except (OSError, ImportError):
        return None


def _die_with(parent_pid: int, libc):
    """A Popen preexec_fn: the task is killed when the launcher dies, even by SIGKILL (Linux).

    Only the task's own process gets the signal; its descendants are the
    launcher's to stop while it lives.
    """
    def preexec():
        if libc is None or not hasattr(libc, "prctl"):
            return
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os._exit(1)
    return preexec


_LIBC = _libc() if sys.platform == "linux" else None


def task_environment(cluster: Cluster, verbose: bool = False, base=None) -> dict:
    """The environment a task's command runs in: TF_CONFIG, quiet logs, legacy Keras."""
    env = dict(os.environ if base is None else base)
    env["TF_CONFIG"] = cluster.tf_config()
    if verbose:
        env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    else:
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.setdefault("GRPC_VERBOSITY", "NONE")
    env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        import importlib.util
        if importlib.util.find_spec("tf_keras") is not None:
            env.setdefault("TF_USE_LEGACY_KERAS", "1")
    except (ImportError, ValueError):
        pass
    return env


def exit_status(returncode: int) -> int:
    """A Popen return code as a shell exit status: 128+N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """``exited with code 3`` or ``was killed by SIGKILL``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def check_command(command, env=None):
    """Raise a one-line :class:`TfclusterError` unless ``command`` can be started."""
    if not command:
        raise TfclusterError("no command to run; give it after '--', e.g. tfcluster local -- python train.py")
    exe = command[0]
    if os.sep in exe:
        if not os.path.isfile(exe):
            raise TfclusterError(f"cannot run {exe!r}: no such file")
        if not os.access(exe, os.X_OK):
            raise TfclusterError(f"cannot run {exe!r}: not executable")
    else:
        path = (env or os.environ).get("PATH", os.defpath)
        if shutil.which(exe, path=path) is None:
            raise TfclusterError(f"cannot run {exe!r}: not found on PATH")
    script = _python_script(command)
    if script is not None and not os.path.isfile(script):
        # Otherwise every task would start (the ps loading TensorFlow) only for each worker to fail.
        raise TfclusterError(f"no such script: {script} (in {' '.join(command[:2])})")


def _python_script(command) -> Optional[str]:
    """The script of ``python [options] script.py ...``; None for other commands, -m and -c."""
    if not re.fullmatch(r"python[\d.]*", os.path.basename(command[0])):
        return None
    args = iter(command[1:])
    for a in args:
        if a in ("-m", "-c", "-") or a.startswith(("-m", "-c")):
            return None
        if a in ("-W", "-X"):
            next(args, None)
        elif not a.startswith("-"):
            return a
    return None


#: The last line of a Python traceback: ``ValueError: bad value`` (module path allowed).
_EXCEPTION_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt))(?::\s*(.*))?")


def failure_cause(lines) -> Optional[str]:
    """What a failed task said last about why: its final exception line, without the module path."""
    for line in reversed(list(lines)):
        line = line.strip()
        m = _EXCEPTION_LINE.fullmatch(line)
        if m:
            text = m.group(1) + (f": {m.group(2).strip()}" if m.group(2) and m.group(2).strip() else "")
        elif "can't open file" in line:
            text = line
        else:
            continue
        return text if len(text) <= 200 else text[:197] + "..."
    return None


# ------------------------------------------------------------------ output
class LineWriter:
    """Writes whole lines to a text stream from many threads without interleaving them."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stdout
        self._lock = threading.Lock()
        self._broken = False

    def line(self, text: str):
        """Write ``text`` (one line, newline added if missing) and flush."""
        if not text.endswith("\n"):
            text += "\n"
        with self._lock:
            if self._broken:
                return
            try:
                self.stream.write(text)
                self.stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                # The reader of our output went away (``| head``); the log
                # files still get every line, so keep supervising.
                self._broken = True


class PrefixedLogHandler(logging.Handler):
    """Sends the launcher's own log records as ``[tfcluster] ...`` lines through a LineWriter."""

    def __init__(self, writer: LineWriter, prefix: str = "[tfcluster] ", error_writer: Optional[LineWriter] = None):
        super().__init__()
        self.writer = writer
        self.prefix = prefix
        self.error_writer = error_writer or writer

    def emit(self, record):
        try:
            level = "" if record.levelno <= logging.INFO else record.levelname.lower() + ": "
            # Why the run failed goes to stderr: it stays on the terminal when stdout is a log file.
            writer = self.error_writer if record.levelno >= logging.ERROR else self.writer
            for part in self.format(record).splitlines() or [""]:
                writer.line(f"{self.prefix}{level}{part}")
        except Exception:  # logging must never take the launcher down
            self.handleError(record)


def use_prefixed_logging(writer: LineWriter, debug: bool = False, error_writer: Optional[LineWriter] = None):
    """Route the ``tfcluster`` logger to ``writer`` as ``[tfcluster]`` lines (errors to ``error_writer``)."""
    handler = PrefixedLogHandler(writer, error_writer=error_writer)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.handlers[:] = [handler]
    if debug:
        log.setLevel(logging.DEBUG)
    elif log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    log.propagate = False


# ------------------------------------------------------------------- tasks
class _HeldPort:
    """A placeholder bound to one given port, as PortReservation binds its ports."""

    def __init__(self, sock):
        self._sock = sock

    def release(self):
        self._sock.close()


def _hold_port(port: int, host: str) -> Optional[_HeldPort]:
    """Bind ``port`` again as a placeholder for a task being restarted; None if it is taken."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        # TF's server binds the wildcard address, so that is what must stay ours.
        s.bind(("::" if ":" in host else "", port))
        return _HeldPort(s)
    except OSError:
        s.close()
        return None


class _Proc:
    """One task of the local cluster: its command, its process, its log, its port."""

    def __init__(self, task: Task, argv, env, log_path, port=None, placeholder=None):
        self.task = task
        self.name = str(task)
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.port = port
        self.placeholder = placeholder      # holds our port (release()) until our server is up
        self.popen: Optional[subprocess.Popen] = None
        self.reader: Optional[threading.Thread] = None
        self.restarts = 0
        self.grace = TERM_GRACE             # SIGTERM -> SIGKILL for this task's group
        self.started_at = 0.0
        self.returncode: Optional[int] = None
        self.known = {}                     # pid -> psutil.Process: every descendant ever seen
        self.tail = collections.deque(maxlen=40)   # the last lines of the current run, for failure_cause
        self._log_lock = threading.Lock()
        self.log_file = open(log_path, "wb")

    @property
    def is_trainer(self) -> bool:
        return self.task.job in TRAINER_JOBS

    @property
    def running(self) -> bool:
        return self.popen is not None and self.returncode is None

    def start(self, writer: LineWriter):
        env = dict(self.env, TFCLUSTER_RESTART_COUNT=str(self.restarts))
        try:
            # The death signal follows the thread that forks: start() always runs
            # on the launcher's supervising thread, which outlives every task.
            self.popen = subprocess.Popen(self.argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                          preexec_fn=_die_with(os.getpid(), _LIBC) if sys.platform == "linux"
                                          else None)
        except OSError as e:
            raise TfclusterError(f"cannot start {self.name} ({self.argv[0]!r}): {e.strerror}") from None
        self.returncode = None
        self.started_at = time.monotonic()
        self.tail.clear()
        self.reader = threading.Thread(target=self._pump, args=(self.popen.stdout, writer),
                                       name=f"tfcluster-log-{self.name}", daemon=True)
        self.reader.start()

    def _pump(self, pipe, writer: LineWriter):
        prefix = f"[{self.name}] "
        try:
            for raw in iter(pipe.readline, b""):
                with self._log_lock:
                    if not self.log_file.closed:
                        self.log_file.write(raw)
                        self.log_file.flush()
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                self.tail.append(text)
                writer.line(prefix + text)
        except (OSError, ValueError):
            pass
        finally:
            pipe.close()

    def poll(self) -> Optional[int]:
        """The return code once the process has exited (it is reaped here, once)."""
        if self.popen is not None and self.returncode is None:
            self.returncode = self.popen.poll()
        return self.returncode

    def remember_descendants(self):
        """Note every descendant now alive, so none escapes when its parent dies first."""
        if not self.running:
            return
        try:
            import psutil
            for p in psutil.Process(self.popen.pid).children(recursive=True):
                self.known.setdefault(p.pid, p)
        except Exception:  # the process ended while we looked
            pass

    def signal_group(self, sig):
        """Send ``sig`` to this task's process group while its leader is unreaped (its pid is ours)."""
        if self.running:
            try:
                os.killpg(self.popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def drain(self, timeout: float):
        """Wait (bounded) for the last lines of the exited process to be shown."""
        if self.reader is not None:
            self.reader.join(timeout)

    def release_port(self):
        if self.placeholder is not None:
            self.placeholder.release()
            self.placeholder = None

    def close(self):
        self.release_port()
        with self._log_lock:
            self.log_file.close()


def _alive(p, own_pids) -> bool:
    """True while psutil process ``p`` runs; reaps it when it is an adopted zombie of ours."""
    import psutil
    try:
        if not p.is_running():
            return False
        if p.status() == psutil.STATUS_ZOMBIE:
            if p.pid not in own_pids and p.ppid() == os.getpid():
                try:
                    os.waitpid(p.pid, os.WNOHANG)
                except ChildProcessError:
                    pass
            return False
        return True
    except psutil.NoSuchProcess:
        return False


# ---------------------------------------------------------------- launcher
class LocalLauncher:
    """Runs one local cluster: starts, supervises, restarts and stops its tasks; see the module doc."""

    def __init__(self, command, ps: int = 1, workers: int = 2, chief: bool = False, evaluator: bool = False,
                 legacy_flags: str = "none", log_dir: Optional[str] = None, timeout: Optional[float] = None,
                 max_restarts: int = 0, evaluator_grace: float = 60.0, verbose: bool = False,
                 host: str = "localhost", writer: Optional[LineWriter] = None, subreaper: bool = False,
                 cluster: Optional[Cluster] = None, join_grace: Optional[float] = None, isolate: bool = False):
        if cluster is None:
            _check_host(host)
        if cluster is not None:
            # An explicit cluster (scripts with hard-coded ports): its jobs decide the counts.
            ps, workers, chief = cluster.num_tasks("ps"), cluster.num_tasks("worker"), bool(cluster.num_tasks("chief"))
            _check_local(cluster)
        if join_grace is not None and not join_grace >= 0:
            raise TfclusterError(f"--join-grace must be >= 0 seconds, got {join_grace:g}")
        for name, n in (("--ps", ps), ("--workers", workers), ("--max-restarts", max_restarts)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise TfclusterError(f"{name} must be a whole number >= 0, got {n!r}")
        if workers == 0 and not chief:
            raise TfclusterError("--workers 0 leaves nobody to train; give --workers 1 or more (or --chief)")
        if timeout is not None and not timeout > 0:
            raise TfclusterError(f"--timeout must be a positive number of seconds, got {timeout:g}")
        if not evaluator_grace >= 0:
            raise TfclusterError(f"--evaluator-grace must be >= 0 seconds, got {evaluator_grace:g}")
        if legacy_flags not in ("all", "job-task", "none"):
            raise TfclusterError(f"--legacy-flags: unknown style {legacy_flags!r}; use all, job-task or none")
        if legacy_flags == "all" and chief:
            raise TfclusterError("--legacy-flags=all has no chief host list (TF1 scripts make worker 0 the "
                                 "chief); drop --chief, or use --legacy-flags=job-task with TF_CONFIG")
        check_command(command)
        self.command = list(command)
        self.counts = {"ps": ps, "workers": workers, "chief": chief}
        self.evaluator = evaluator
        self.legacy_flags = legacy_flags
        self.log_dir = log_dir
        self.timeout = timeout
        self.max_restarts = max_restarts
        self.evaluator_grace = evaluator_grace
        self.verbose = verbose
        self.host = host
        self.writer = writer or LineWriter()
        self.subreaper = subreaper
        self.explicit = cluster
        self.join_grace = join_grace
        self.isolate = isolate
        self.isolated = False
        self._chief_done_at: Optional[float] = None
        self._join_hinted = False
        self.cluster: Optional[Cluster] = None
        self.procs = []
        self.shutdown_seconds: Optional[float] = None   # last trainer exit -> last task process gone
        self._signals = []
        self._lock = threading.Lock()
        self._finished = threading.Event()

    # ------------------------------------------------------------ set-up
    def _make_log_dir(self) -> str:
        if self.log_dir:
            path = self.log_dir
        else:
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            path = os.path.join("tfcluster-logs", stamp)
            n = 1
            while os.path.exists(path):
                n += 1
                path = os.path.join("tfcluster-logs", f"{stamp}-{n}")
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise TfclusterError(f"cannot create log dir {path}: {e.strerror}") from None
        return path

    def _reserve(self):
        total = self.counts["ps"] + self.counts["workers"] + int(self.counts["chief"])
        held = []
        try:
            # One reservation per task, each taken while the others are held,
            # so the ports differ and each can be dropped on its own.
            for _ in range(total):
                held.append(PortReservation(1, self.host))
        except OSError as e:
            for r in held:
                r.release()
            raise TfclusterError(f"cannot reserve {total} port(s) on {self.host}: {e.strerror}") from None
        return held

    def _hold_explicit(self) -> dict:
        """Hold the given ports of an explicit cluster as placeholders; one clear line if one is taken."""
        held = {}
        for t in self.explicit.tasks():
            host, port = parse_address(self.explicit.address(t))
            h = _hold_port(port, host)
            if h is None:
                for x in held.values():
                    x.release()
                from .ports import port_holder
                who = port_holder(port)
                raise TfclusterError(f"port {port} of {t} ({self.explicit.address(t)}) is already in use"
                                     + (f" (held by {who})" if who else ""))
            held[port] = h
        return held

    def _build(self, log_dir: str):
        if self.explicit is not None:
            cluster = self.explicit
            by_port = self._hold_explicit()
        else:
            held = self._reserve()
            try:
                cluster = Cluster.local(ps=self.counts["ps"], workers=self.counts["workers"],
                                        chief=self.counts["chief"], host=self.host,
                                        ports=[r.ports[0] for r in held])
            except TfclusterError:
                for r in held:
                    r.release()
                raise
            by_port = {r.ports[0]: r for r in held}
        self.cluster = cluster
        spec = os.path.join(log_dir, "cluster.json")
        with open(spec, "w", encoding="utf-8") as f:
            f.write(cluster.to_json())
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        tasks = cluster.tasks(("ps",)) + cluster.tasks(TRAINER_JOBS)
        if self.evaluator:
            tasks.append(Task("evaluator", 0))
        for t in tasks:
            view = cluster.with_task(t.job, t.index)
            env = task_environment(view, self.verbose)
            if t.job == "ps" and self.legacy_flags == "none":
                argv = [sys.executable, "-m", "tfcluster", "start", "--cluster", spec,
                        "--job", "ps", "--task", str(t.index)] + (["--verbose"] if self.verbose else [])
                # The ps child must import the very tfcluster that runs this launcher.
                env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
            else:
                argv = self.command + view.legacy_flags(style=self.legacy_flags)
            port = placeholder = None
            if t.job != "evaluator":
                env.update(REUSE_ENV)
                port = parse_address(cluster.address(t))[1]
                placeholder = by_port.pop(port)   # the task owns it now, and drops it once it serves
            proc = _Proc(t, argv, env, os.path.join(log_dir, f"{t.job}-{t.index}.log"), port, placeholder)
            if t.job == "ps" and self.legacy_flags == "none":
                proc.grace = HOSTED_PS_GRACE
            self.procs.append(proc)

    # ----------------------------------------------------------- running
    def run(self) -> int:
        """Start the cluster, supervise it until the trainers are done, stop it; return the exit code."""
        log_dir = self._make_log_dir()
        self._isolate()
        log.info("logs: %s (one file per task)", log_dir)
        if self.subreaper:
            self._become_subreaper()
        previous = self._install_signal_handlers()
        prober = None
        try:
            self._build(log_dir)
            log.info("cluster: %s", ", ".join(f"{t} {self.cluster.address(t)}" for t in self.cluster.tasks()))
            for p in self.procs:
                p.start(self.writer)
                log.info("%s started (pid %d): %s", p.name, p.popen.pid, " ".join(shlex.quote(a) for a in p.argv))
            prober = threading.Thread(target=self._release_ports_when_up, name="tfcluster-ports", daemon=True)
            prober.start()
            return self._supervise()
        finally:
            self._finished.set()
            self._stop(self.procs)
            self._sweep_adopted()
            # Every process is gone, so each pipe ends as soon as its reader
            # catches up; on a loaded machine that can take more than a
            # second, and closing early lost a task's last lines.
            drained_by = time.monotonic() + 10.0
            for p in self.procs:
                p.drain(max(0.1, drained_by - time.monotonic()))
                p.close()
            if prober is not None:
                prober.join(2.0)
            self._restore_signal_handlers(previous)

    def _supervise(self) -> int:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        trainers = [p for p in self.procs if p.is_trainer]
        last_look = 0.0
        while True:
            code = self._check_interrupts(deadline)
            if code is not None:
                return code
            now = time.monotonic()
            if now - last_look > 0.5:
                for p in self.procs:
                    p.remember_descendants()
                self._sweep_adopted(stop=False)
                last_look = now
            for p in self.procs:
                if not p.running or p.poll() is None:
                    continue
                code = self._on_exit(p)
                if code is not None:
                    return code
            if all(p.returncode == 0 for p in trainers):
                break
            if self._left_in_join(trainers):
                break
            time.sleep(_POLL)
        last_exit = time.monotonic()
        others = [p for p in self.procs if p.task.job != "evaluator"]
        if any(p.running for p in others if not p.is_trainer):
            log.info("all %d trainer(s) finished; stopping %s", len(trainers),
                     ", ".join(p.name for p in others if p.running))
        self._stop(others)
        self.shutdown_seconds = time.monotonic() - last_exit
        log.debug("every task process was gone %.2fs after the last trainer exited", self.shutdown_seconds)
        code = self._finish_evaluator(deadline)
        if code is not None:
            return code
        log.info("done: %d trainer(s) succeeded", len(trainers))
        return 0

    def _left_in_join(self, trainers) -> bool:
        """True once the chief finished --join-grace seconds ago: the trainers still running are
        taken to be left in server.join() (in-graph TF1 scripts), and are stopped like the ps."""
        chief = next((p for p in trainers if p.task.job == "chief"), None) or \
            next((p for p in trainers if p.task == Task("worker", 0)), None)
        if chief is None or chief.returncode != 0:
            self._chief_done_at = None
            return False
        now = time.monotonic()
        if self._chief_done_at is None:
            self._chief_done_at = now
        running = [p.name for p in trainers if p.running]
        waited = now - self._chief_done_at
        if self.join_grace is not None and waited >= self.join_grace:
            log.info("%s finished %.0fs ago and %s still run: taken to be left in server.join() "
                     "(--join-grace %g); stopping them", chief.name, waited, ", ".join(running), self.join_grace)
            return True
        if self.join_grace is None and waited >= 30.0 and not self._join_hinted:
            self._join_hinted = True
            log.info("%s finished 30s ago; still waiting for %s (if they sit in server.join(), "
                     "--join-grace S stops them S seconds after the chief)", chief.name, ", ".join(running))
        return False

    def _check_interrupts(self, deadline) -> Optional[int]:
        if self._signals:
            sig = self._signals[0]
            log.warning("got %s; stopping the cluster", signal.Signals(sig).name)
            return 128 + sig
        if deadline is not None and time.monotonic() >= deadline:
            log.error("timed out after %gs (--timeout); stopping the cluster", self.timeout)
            return EXIT_TIMEOUT
        return None

    def _on_exit(self, p: _Proc) -> Optional[int]:
        """React to a task that exited; return an exit code when the run must end."""
        code = p.returncode
        # Leftovers of the task's own tree go first: a restart needs the port
        # free, and a leftover that inherited the pipe would hold the drain up.
        self._stop_leftovers(p)
        p.drain(1.0)
        if p.task.job == "evaluator":
            (log.info if code == 0 else log.warning)("%s %s (log: %s)", p.name, describe_exit(code), p.log_path)
            return None
        if code == 0:
            log.info("%s finished", p.name)
            return None
        cause = failure_cause(p.tail) if code > 0 else None
        why = f" ({cause})" if cause else ""
        if p.restarts < self.max_restarts:
            p.restarts += 1
            log.warning("%s %s%s; restarting it (restart %d of %d, same TF_CONFIG and port)",
                        p.name, describe_exit(code), why, p.restarts, self.max_restarts)
            with self._lock:
                if p.placeholder is None and p.port is not None:
                    p.placeholder = _hold_port(p.port, self.host)
                    if p.placeholder is None:
                        log.debug("could not hold port %d again for %s; it restarts without a placeholder",
                                  p.port, p.name)
                p.start(self.writer)
            log.info("%s restarted (pid %d)", p.name, p.popen.pid)
            return None
        what = "" if not self.max_restarts else f" after {p.restarts} restart(s)"
        log.error("%s %s%s%s; see its log: %s", p.name, describe_exit(code), why, what, p.log_path)
        others = [q.name for q in self.procs if q.running]
        if others:
            log.info("stopping the cluster (%s)", ", ".join(others))
        return exit_status(code)

    def _finish_evaluator(self, deadline) -> Optional[int]:
        evaluators = [p for p in self.procs if p.task.job == "evaluator" and p.running]
        if not evaluators:
            return None
        log.info("waiting up to %gs (--evaluator-grace) for the evaluator to finish", self.evaluator_grace)
        end = time.monotonic() + self.evaluator_grace
        while any(p.running for p in evaluators) and time.monotonic() < end:
            code = self._check_interrupts(deadline)
            if code is not None:
                return code
            for p in evaluators:
                if p.running and p.poll() is not None:
                    self._on_exit(p)
            time.sleep(_POLL)
        if any(p.running for p in evaluators):
            log.info("the evaluator did not finish within %gs; stopping it", self.evaluator_grace)
            self._stop(evaluators)
        return None

    # --------------------------------------------------------- isolation
    def _isolate(self):
        """Move this launcher (and so every task it starts) into its own loopback-only network namespace."""
        exposed = ("every task's server listens on all interfaces with no authentication; "
                   "keep this machine on a trusted network")
        if not self.isolate:
            log.info("isolation: off (--no-isolate): %s", exposed)
            return
        hosts = ([parse_address(self.explicit.address(t))[0] for t in self.explicit.tasks()]
                 if self.explicit is not None else [self.host])
        from .cluster import is_loopback
        remote = [h for h in hosts if not is_loopback(h)]
        if remote:
            log.info("isolation: off (%s is not a loopback address): %s", remote[0], exposed)
            return
        why = isolate_network()
        if why is not None:
            log.info("isolation: off (%s): %s", why, exposed)
            return
        self.isolated = True
        log.info("isolation: on: the cluster runs in its own network namespace with only loopback, so no "
                 "other host can reach its ports, and its tasks cannot reach the network (--no-isolate "
                 "to turn off)")

    # ---------------------------------------------------------- stopping
    def _own_pids(self):
        return {p.popen.pid for p in self.procs if p.popen is not None}

    def _stop_leftovers(self, p: _Proc):
        """Kill what an exited task left behind (its group and every descendant we saw)."""
        own = self._own_pids()
        for q in list(p.known.values()):
            if _alive(q, own):
                try:
                    q.kill()
                except Exception:
                    pass
        p.known.clear()

    def _stop(self, procs):
        """SIGTERM every process of these tasks (groups and trees), SIGKILL survivors after each task's grace."""
        import psutil
        own = self._own_pids()
        for p in procs:
            p.remember_descendants()
        extra = []
        if self.subreaper and procs is self.procs:
            try:
                extra = psutil.Process().children(recursive=True)
            except psutil.Error:
                pass
        others = [q for p in procs for q in p.known.values()] + [q for q in extra if q.pid not in own]
        leaders = [p for p in procs if p.running]
        for p in leaders:
            p.signal_group(signal.SIGTERM)
        for q in others:
            if _alive(q, own):
                try:
                    q.terminate()
                except psutil.Error:
                    pass

        def pending():
            return [p for p in leaders if p.poll() is None] + [q for q in others if _alive(q, own)]
        start = time.monotonic()
        killed = set()
        end = start + max([p.grace for p in leaders] + [TERM_GRACE if others else 0.0])
        while pending() and time.monotonic() < end and len(self._signals) < 2:
            for p in leaders:
                if p.name not in killed and p.poll() is None and time.monotonic() >= start + p.grace:
                    log.debug("SIGKILL to %s, still alive %gs after SIGTERM", p.name, p.grace)
                    p.signal_group(signal.SIGKILL)
                    killed.add(p.name)
            time.sleep(0.02)
        left = pending()
        if left:
            log.debug("SIGKILL to %d process(es) still alive after SIGTERM", len(left))
        for p in leaders:
            if p.poll() is None:
                p.signal_group(signal.SIGKILL)
        for q in others:
            if _alive(q, own):
                try:
                    q.kill()
                except psutil.Error:
                    pass
        end = time.monotonic() + 5.0
        while pending() and time.monotonic() < end:
            time.sleep(0.02)
        for p in procs:
            p.known = {pid: q for pid, q in p.known.items() if _alive(q, own)}

    def _become_subreaper(self):
        # Orphans of our tasks (a daemonised grandchild) are then reparented to
        # us rather than init, so the final sweep finds and stops them too.
        if _LIBC is None or not hasattr(_LIBC, "prctl"):
            log.debug("no PR_SET_CHILD_SUBREAPER here; orphans are found by walking process trees")
        elif _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            import ctypes
            log.debug("prctl(PR_SET_CHILD_SUBREAPER) failed: %s", os.strerror(ctypes.get_errno()))

    def _sweep_adopted(self, stop: bool = True):
        """Reap adopted zombies, and at the end stop every adopted orphan still running."""
        if not self.subreaper:
            return
        import psutil
        own = self._own_pids()
        try:
            kids = [q for q in psutil.Process().children(recursive=True) if q.pid not in own]
        except psutil.Error:
            return
        alive = [q for q in kids if _alive(q, own)]
        if stop and alive:
            log.debug("stopping %d orphaned process(es)", len(alive))
            for q in alive:
                try:
                    q.kill()
                except psutil.Error:
                    pass
            end = time.monotonic() + 5.0
            while any(_alive(q, own) for q in alive) and time.monotonic() < end:
                time.sleep(0.02)

    # ------------------------------------------------------------- ports
    def _release_ports_when_up(self):
        """Drop each task's port placeholder once its server answers (or after PORT_HOLD_LIMIT)."""
        from .server import probe
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
                    if states.get(p.task) == "up":
                        log.debug("%s answers on port %d; placeholder released", p.name, p.port)
                        p.release_port()
                    elif now - p.started_at > PORT_HOLD_LIMIT:
                        log.debug("%s is not serving after %gs; port %d placeholder released",
                                  p.name, PORT_HOLD_LIMIT, p.port)
                        p.release_port()

    # ----------------------------------------------------------- signals
    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}

        def handler(signum, _frame):
            self._signals.append(signum)
        for s in _STOP_SIGNALS:
            try:
                previous[s] = signal.signal(s, handler)
            except (OSError, ValueError):
                pass
        return previous

    def _restore_signal_handlers(self, previous):
        for s, h in previous.items():
            try:
                signal.signal(s, h)
            except (OSError, ValueError, TypeError):
                pass


def _check_host(host: str):
    """Refuse a --host that does not resolve or is not an address of this machine, before anything starts."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise TfclusterError(f"--host {host!r} does not resolve") from None
    for family, _, _, _, addr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr[0], 0))
                return
            except OSError:
                continue
    raise TfclusterError(f"--host {host} ({infos[0][4][0]}) is not an address of this machine; tfcluster local "
                         "runs every task here (use tfcluster start on each host instead)")


_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000


def _unshare(flags: int):
    import ctypes
    if _LIBC is None:
        raise OSError(errno.ENOSYS, "no C library to call unshare() in")
    if _LIBC.unshare(flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _loopback_up():
    import fcntl
    import struct
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, siocgifflags, ifreq))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh22x", b"lo", flags | iff_up))


def isolate_network() -> Optional[str]:
    """Move this process into a new network namespace with only loopback, up; None, or why it cannot.

    As root that takes CAP_SYS_ADMIN only; otherwise a user namespace of our
    own grants it (where the system allows unprivileged user namespaces, and
    only while the process has a single thread). It is for good: the process
    and every child it starts afterwards see no network but loopback.
    """
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    try:
        _unshare(_CLONE_NEWNET)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EACCES):
            return f"cannot create a network namespace: {e.strerror}"
        uid, gid = os.getuid(), os.getgid()
        try:
            _unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
        except OSError as e2:
            return f"cannot create a network namespace: {e2.strerror}"
        try:
            # Keep our own uid and gid inside, so files the tasks write are ours outside.
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        except OSError as e3:
            # There is no way back from here: say so rather than run half-isolated.
            raise TfclusterError(f"isolation failed: cannot map this user into its new user namespace "
                                 f"({e3.strerror}); use --no-isolate") from None
    try:
        _loopback_up()
    except OSError as e:
        raise TfclusterError(f"isolation failed: cannot bring loopback up in the new network namespace "
                             f"({e.strerror}); use --no-isolate") from None
    return None


def _check_local(cluster: Cluster):
    """Refuse an explicit cluster with a task that is not on this machine."""
    from .cluster import is_loopback
    local_names = {"localhost", socket.gethostname(), socket.getfqdn()}
    for t in cluster.tasks():
        host, _ = parse_address(cluster.address(t))
        if not (is_loopback(host) or host in local_names):
            raise TfclusterError(f"{t} is at {cluster.address(t)}, not on this machine; tfcluster local runs "
                                 "every task here (use tfcluster start on each host instead)")


def run_local(command, writer: Optional[LineWriter] = None, **options) -> int:
    """Run a local cluster for ``command`` (see :class:`LocalLauncher`); return its exit code."""
    return LocalLauncher(command, writer=writer, **options).run()


__all__ = ["LocalLauncher", "run_local", "task_environment", "check_command", "failure_cause", "isolate_network",
           "LineWriter",
           "PrefixedLogHandler", "use_prefixed_logging", "exit_status", "describe_exit", "EXIT_TIMEOUT",
           "TRAINER_JOBS"]
