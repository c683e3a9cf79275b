"""One trainer's run, assembled one way under every front end: its part, its server, its session, its hooks.

``fit`` (:mod:`.train`), the Estimator (:mod:`tfcluster.estimator.training_graph`)
and tf-keras's ``fit`` (:mod:`tfcluster.keras.fit`) build different graphs,
but run them by one recipe, what TF 1.x's Scaffold and
``MonitoredTrainingSession`` did for every program:

- the task's part (:func:`part_of`): a ps serves until every trainer is
  done, the evaluator follows the checkpoints, a trainer trains, and any
  other task is stopped in one line;
- a trainer's server, configured by its strategy (towers' virtual devices, a
  collective group's leader), and the wait for the ps tasks it needs;
- the chief's checkpoint dir, made writable (and its last run's done marker
  gone) before the graph is built, and its Saver sharded where every ps
  writes that dir (:mod:`.savers`);
- the :class:`~.session.TrainingSession`: whoever the strategy says
  initialises (the chief, or every worker of an all-reduce) initialises or
  restores, the chief with its saver and dir;
- the hooks every trainer needs, in one order (:meth:`RunAssembly.hooks`).

A front end adds what is its own (Keras's saver, the Estimator's listeners
and step log, fit's progress lines) through the hooks' slots.
"""

import logging
import os
from typing import Callable, Optional

from ..core import environment
from ..core.errors import TfclusterError
from ..graph import precision
from ..runtime.checkpoints import prepare_checkpoint_dir
from ..runtime.server import task_server, wait_for_cluster
from ..runtime.shutdown import serve_as_ps
from ..topology.cluster import Role
from .hooks import STILL_SECS, CheckpointHook, IncrementHook, TableRowsHook, trainers_done
from .liveness import CHIEF_TIMEOUT_SECS, heartbeat
from .savers import checkpoint_saver, sharding
from .session import MAX_RECOVERIES, STARTUP_TIMEOUT_SECS, STEP_TIMEOUT_SECS, TrainingSession

log = logging.getLogger("tfcluster")


def part_of(cluster, what: str) -> Optional[Role]:
    """This task's part in ``what`` (a front end's name, for the error line); None alone, without a cluster.

    A ps serves here until every trainer is done, then returns :attr:`Role.PS`;
    :attr:`Role.EVALUATOR` is the front end's to run; a trainer gets its role.
    A task of no role (TF 1.x's ``local``) is refused in one line.
    """
    if cluster is None:
        return None
    role = cluster.role()
    if role is Role.PS:
        serve_as_ps(cluster)
        return role
    if role is Role.EVALUATOR or (role is not None and role.trains):
        return role
    raise TfclusterError(f"{what} trains on the chief and the workers, serves on the ps and evaluates on the "
                         f"evaluator; {cluster.task} is none of them: give its job one of those names")


class RunAssembly:
    """A trainer's server, session and standard hooks, built the same way for ``fit``, the Estimator and Keras.

    ``cluster`` is None for one process. ``should_init``: whether this task
    initialises the variables (the strategy's :attr:`~tfcluster.strategies.Strategy.should_init`;
    default: the chief). ``checkpoint_dir`` is where the chief saves and
    restores. The bounds are :class:`~tfcluster.training.train.FitConfig`'s.
    """

    def __init__(self, cluster, *, name: Optional[str] = None, should_init: Optional[bool] = None,
                 checkpoint_dir: Optional[str] = None, startup_timeout: float = STARTUP_TIMEOUT_SECS,
                 max_recoveries: int = MAX_RECOVERIES, step_timeout_secs: float = STEP_TIMEOUT_SECS,
                 chief_timeout_secs: float = CHIEF_TIMEOUT_SECS):
        self.cluster = cluster
        self.name = name or (str(cluster.task) if cluster is not None else "local")
        self.is_chief = cluster is None or cluster.is_chief
        self.should_init = self.is_chief if should_init is None else should_init
        self.checkpoint_dir = os.path.abspath(checkpoint_dir) if checkpoint_dir else None
        self.startup_timeout, self.max_recoveries = startup_timeout, max_recoveries
        self.step_timeout_secs, self.chief_timeout_secs = step_timeout_secs, chief_timeout_secs
        self.target = ""
        #: The chief's checkpoint hook, once :meth:`hooks` made it (its ``checkpoint`` is the run's last).
        self.checkpoints = None
        #: Whether the chief's saves are sharded (each ps writes its own variables), once :meth:`prepare` asked.
        self.sharded = False

    @property
    def saves(self) -> bool:
        """True on the process that writes checkpoints: the chief, given a dir."""
        return self.is_chief and self.checkpoint_dir is not None

    def serve(self, server_config=None):
        """Start this task's server (``server_config``: the strategy's) and wait for the ps tasks it needs."""
        if self.cluster is not None:
            self.target = task_server(self.cluster, config=server_config).target
            wait_for_cluster(self.cluster, timeout=self.startup_timeout)

    def prepare(self):
        """The chief's checkpoint dir, writable and without its last run's done marker, before any graph; whether
        every ps writes it too (after :meth:`serve`: the ps tasks answer)."""
        if self.saves:
            prepare_checkpoint_dir(self.checkpoint_dir)
            self.sharded = sharding(self.cluster, self.target, self.checkpoint_dir)

    def saver(self, **kwargs):
        """The chief's Saver (TF's ``Saver`` keywords: ``max_to_keep`` ...), sharded where :meth:`prepare` found
        that every ps writes the checkpoint dir."""
        return checkpoint_saver(self.sharded, **kwargs)

    def _table_rows(self, train_graph, session) -> list:
        """The chief's count of embedding-variable rows per ps for the launcher (none without such variables)."""
        from ..embedding import embedding_variables
        graph = train_graph.global_step.graph
        return [TableRowsHook(session.call, graph)] if embedding_variables(graph) else []

    def _increments(self, train_graph, session, steps, secs) -> list:
        """The chief's increment hook, where the model has embedding variables to save by increments."""
        from ..embedding import embedding_variables
        from ..embedding.increments import Increments
        graph = train_graph.global_step.graph
        if not embedding_variables(graph):
            log.warning("%s: incremental checkpoints save the rows of embedding variables, and this model has none; "
                        "the chief saves full checkpoints only", self.name)
            return []
        return [IncrementHook(session.call, Increments(graph, self.sharded), self.checkpoints, save_steps=steps,
                              save_secs=secs, name=self.name)]

    def session(self, train_graph, *, config, saver=None, extra_local_init=(), **scaffold) -> TrainingSession:
        """The run's TrainingSession, its config with bfloat16 math where the CPU has it (graph/precision.py);
        ``scaffold``: TF's ``init_fn`` and ``init_feed_dict``."""
        if config is None:
            import tensorflow as tf
            config = tf.compat.v1.ConfigProto()
        config = precision.configure(config, target=self.target)
        if precision.is_on(config):
            log.info("%s does its matrix math in bfloat16, weights kept in float32 (the CPU multiplies bfloat16; "
                     "--math float32 turns it off)", self.name)
        return TrainingSession(
            train_graph, target=self.target, config=config, is_chief=self.should_init, saver=saver,
            checkpoint_dir=self.checkpoint_dir if self.is_chief else None, extra_local_init=extra_local_init,
            cluster=self.cluster, name=self.name, startup_timeout=self.startup_timeout,
            max_recoveries=self.max_recoveries, step_timeout_secs=self.step_timeout_secs, **scaffold)

    def hooks(self, train_graph, session, *, saver=None, save_steps=None, save_secs=None,
              checkpoint_hook: Callable = CheckpointHook, own=(), summary=None, chief=(), after=(),
              still_secs: Optional[float] = STILL_SECS, increment_steps=None, increment_secs=None,
              **waits) -> list:
        """Every hook of the run, in its one order.

        First the wait for the other trainers (the chief's final save must
        hold their last steps; ``waits`` and ``still_secs`` tune it), then the
        front end's ``own``, the ``summary`` hook, the chief's checkpoints (by
        ``checkpoint_hook``, every ``save_steps`` / ``save_secs``, when a
        ``saver`` is given, and its increments every ``increment_steps`` /
        ``increment_secs``) and ``chief`` hooks, the chief's heartbeat, and
        ``after`` last.
        """
        hooks = trainers_done(train_graph, self.cluster, self.is_chief, self.name, session, still_secs=still_secs,
                              **waits)
        hooks += list(own) + ([summary] if summary is not None else [])
        if saver is not None:
            self.checkpoints = checkpoint_hook(session.call, saver, self.checkpoint_dir, train_graph.global_step,
                                               name=self.name, save_steps=save_steps, save_secs=save_secs)
            hooks.append(self.checkpoints)
            if increment_steps or increment_secs is not None:
                hooks += self._increments(train_graph, session, increment_steps, increment_secs)
        hooks += list(chief) if self.is_chief else []
        if self.is_chief and self.cluster is not None and environment.PS_STATE_RECORD.get():
            hooks += self._table_rows(train_graph, session)
        beat = heartbeat(train_graph, self.cluster, self.name, self.chief_timeout_secs, self.checkpoint_dir)
        return hooks + ([beat] if beat is not None else []) + list(after)
