"""The step contract: what a front end builds, what the session runs, and the hooks the loop calls.

Whoever builds a training graph (a strategy, the Estimator's ``model_fn``, a
Keras model) hands the session a :class:`TrainGraph`: the :class:`StepRunner`
that runs one step, the global step, the loss, the ops that initialise and
check the shared state, and the hooks it needs. The loop runs each step
through the session and calls every hook around it.

A :class:`Hook` has the five callbacks of TensorFlow's
``tf.compat.v1.train.SessionRunHook`` (monitored_session.py's extension
point), with the same arguments, so a TF hook (``StopAtStepHook``,
``LoggingTensorHook``, a SyncReplicasOptimizer's hook, a user's own) runs in
tfcluster's loop unchanged, and a tfcluster hook is written the way TF users
know:

- ``begin()``: once, before the graph is finalized; may add ops;
- ``after_create_session(session, coord)``: after each session (re)creation,
  before the first step on it; ``coord`` is that session's
  ``tf.train.Coordinator`` (for queue-runner threads);
- ``before_run(run_context)``: before each step; return :class:`RunArgs` to
  have more fetched with the step, or None;
- ``after_run(run_context, run_values)``: after each step;
  ``run_values.results`` holds what ``before_run`` asked for;
- ``end(session)``: once, when training ends normally;
- ``interrupted(global_step)`` (tfcluster's, not TF's): once, before
  ``end``, when a SIGTERM stopped the loop; ``global_step`` is the step the
  last checkpoint holds.

``run_context`` is a :class:`StepContext`: the session, ``request_stop()``,
and, beyond TF's, the global step, the target step and ``call(fn)``, which
runs ``fn(session)`` with the training session's recovery. Sessions, steps
and recovery stay tfcluster's (:mod:`tfcluster.training.session`): a hook
cannot bring back TF's unbounded waits. The loop's own features are hooks too
(:mod:`tfcluster.training.hooks`).
"""

import collections
import math
from dataclasses import dataclass, field
from typing import Any, Optional

#: What ``before_run`` returns: fetches to run along with the step (TF's SessionRunArgs has the same fields).
RunArgs = collections.namedtuple("RunArgs", ["fetches", "feed_dict", "options"])
RunArgs.__new__.__defaults__ = (None, None)

#: What ``after_run`` gets: TF's SessionRunValues fields, plus the step's global step and loss.
StepValues = collections.namedtuple("StepValues", ["results", "options", "run_metadata", "global_step", "loss"])


class Hook:
    """A loop extension with ``SessionRunHook``'s callbacks (see the module doc); every one is optional."""

    def begin(self):
        """Called once before the graph is finalized; may add ops."""

    def after_create_session(self, session, coord):
        """Called after each session (re)creation, before the first step on it."""

    def before_run(self, run_context) -> Optional[RunArgs]:
        """Called before each step; return RunArgs to fetch more with the step."""
        return None

    def after_run(self, run_context, run_values):
        """Called after each step with what ``before_run`` asked for."""

    def end(self, session):
        """Called once when training ends normally."""

    def interrupted(self, global_step: int):
        """Called once before ``end`` when a SIGTERM stopped the loop at ``global_step``."""


class StepContext:
    """What hooks see of the loop: the session, the steps, a stop request, and recovering calls."""

    def __init__(self, training_session, last_step: int, original_args=None):
        self._training = training_session
        self.last_step = last_step
        self.original_args = original_args
        self.global_step = 0        # after the last step (or at the start)
        self.local_steps = 0        # steps this process ran
        self._stop = False

    @property
    def session(self):
        """The current ``tf.compat.v1.Session`` (a new one after each recovery)."""
        return self._training.session

    def call(self, fn):
        """``fn(session)``, recovering the session the way a step does."""
        return self._training.call(fn)

    def request_stop(self):
        """End the loop after this step."""
        self._stop = True

    @property
    def stop_requested(self) -> bool:
        """True once a hook asked the loop to stop."""
        return self._stop


@dataclass
class StepResult:
    """One step as the loop sees it: the global step after it, this replica's loss, what hooks asked for."""

    global_step: int
    loss: float = math.nan
    results: Any = None
    run_metadata: Any = None


def run_with_request(run, fetches, request, options=None):
    """``run(fetches + [request.fetches])`` with the request's feeds, and its options (else ``options``).

    ``run`` is ``session.run`` or a wrapper of it. Returns ``(values of
    fetches, the request's results, run metadata)``: hooks that asked for a
    trace get its metadata, as from TF's MonitoredSession.
    """
    import tensorflow as tf
    opts = request.options if request.options is not None else options
    meta = tf.compat.v1.RunMetadata() if opts is not None else None
    *values, results = run(list(fetches) + [request.fetches], feed_dict=request.feed_dict, options=opts,
                           run_metadata=meta)
    return values, results, meta


class StepRunner:
    """Runs one training step on a session; one ``session.run`` for the simple strategies.

    ``attach`` is called after each session (re)creation and builds a
    callable, so that a step nobody asked more of costs one C++ call with no
    fetch parsing.
    """

    def __init__(self, train_fetch, loss):
        self.train_fetch = train_fetch  # a tensor: the global step after this step's update
        self.loss = loss
        self._session = self._run = None
        self.step_options = None        # RunOptions with the step timeout (a silent task), from attach
        #: Called while a step waits long for other tasks (sync): a hook may raise to end the wait.
        self.on_stall = []

    def attach(self, session, step_timeout_secs=None):
        """Bind to ``session``; a step (or any run of the runner's) lasting ``step_timeout_secs`` fails."""
        import tensorflow as tf
        self._session = session
        self.step_options = tf.compat.v1.RunOptions(timeout_in_ms=int(step_timeout_secs * 1000)) \
            if step_timeout_secs else None
        self._run = session.make_callable([self.train_fetch, self.loss], accept_options=True)

    def step(self, request=None) -> StepResult:
        """Run one step, fetching what ``request`` (hooks' :class:`~tfcluster.training.hooks.RunArgs`) asks along."""
        # A step TF falsely rejects is run again by the session layer (core/duplicates.py); what it read is
        # gated on its ps tasks having taken it (graph/gate.py), so the rerun reads what it would have.
        if request is None:
            gs, loss = self._run(options=self.step_options)
            return StepResult(int(gs), float(loss))
        (gs, loss), results, meta = run_with_request(self._session.run, [self.train_fetch, self.loss], request,
                                                     self.step_options)
        return StepResult(int(gs), float(loss), results, meta)


@dataclass
class TrainGraph:
    """A built training graph, as a strategy hands it to the session and the loop.

    - ``runner``: runs one step (see :class:`StepRunner`).
    - ``global_step``, ``loss`` (this worker's mean per-example loss).
    - ``local_init_ops``: run by every session after the model is ready
      (worker-local state). ``chief_local_init_ops``: run by the chief's
      sessions only, also after a restore (shared state kept out of checkpoints).
    - ``state_variables``: shared variables that are not part of the model
      (not checkpointed) but must be initialised before anyone trains.
    - ``hooks``: :class:`~tfcluster.training.hooks.Hook` objects the strategy needs.
    - ``staging``: where the next step's rows are fetched during this one (:class:`~.prefetch.Staging`), or None.
    """

    runner: StepRunner
    global_step: Any
    loss: Any
    local_init_ops: list = field(default_factory=list)
    chief_local_init_ops: list = field(default_factory=list)
    state_variables: list = field(default_factory=list)
    hooks: list = field(default_factory=list)
    model: Any = None
    staging: Any = None     #: the lookups staged one step ahead (graph/prefetch.py), primed by every session

    def add_state(self, variable, initial=None):
        """``variable`` is shared state beside the model: every worker waits for it, the chief initialises it
        where the ps has none (after a restore too, since checkpoints do not hold it)."""
        self.state_variables.append(variable)
        self.chief_local_init_ops.append(init_if_needed(variable, initial))


def init_if_needed(variable, initial=None):
    """An op that initialises ``variable`` (to ``initial()``, else with its initializer) unless it already is."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    with tf1.get_default_graph().colocate_with(variable):
        def init():
            op = variable.initializer if initial is None else variable.assign(initial(), read_value=False)
            with tf.control_dependencies([op]):
                return tf.constant(True)
        return tf1.cond(tf1.is_variable_initialized(variable), lambda: tf.constant(False), init).op


def global_step_after(ops, global_step):
    """The global step read after ``ops`` ran: what a step runner fetches."""
    import tensorflow as tf
    with tf.control_dependencies(list(ops)):
        return tf.identity(global_step.read_value())
