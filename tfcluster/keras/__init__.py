"""Graph-mode tf.keras ``fit`` across a cluster: every worker trains the same variables, on the ps.

A compiled tf-keras model (graph mode: TF1 mode, or ``disable_eager_execution``)
trains on a cluster with :func:`fit`, or unchanged with ``model.fit`` in TF1
mode (which routes a trainer's ``fit`` here when TF_CONFIG has ps tasks), on
the training session, loop and hooks that ``fit`` and the Estimator use.
Updates are asynchronous, as in TF 1.x between-graph training; ``sync=True``
makes every step take one gradient from each worker
(:mod:`tfcluster.strategies.sync_replicas`). The modules, top down:

- :mod:`.fit`: ``fit``, one trainer's cluster fit (session, hooks, tf-keras's
  loop over them), the data shards, the trained state handed back;
- :mod:`.graph`: the model's clone in a graph of its own, variables on the ps,
  built for the data;
- :mod:`.session`: the session tf-keras's backend sees, always the current one;
- :mod:`.checkpoints`: the chief's checkpoints in tf-keras's format, named and
  kept as every tfcluster checkpoint;
- :mod:`.step`: a tf-keras train step as the training session runs steps;
- :mod:`.towers`: a compiled model on several devices of one process
  (``compile(distribute=MirroredStrategy(num_gpus=N))`` in TF1 mode);
- :mod:`.collective`: a copy on each worker, gradients all-reduced, with no ps
  (``CollectiveAllReduceStrategy`` or ``MultiWorkerMirroredStrategy`` in TF1 mode).
"""

from ..training.hooks import FINISH_TIMEOUT_SECS
from .fit import DEFAULT_DIR, default_checkpoint_dir, fit, route_fit_through_cluster, shard, trains_on_cluster

__all__ = ["fit", "shard", "trains_on_cluster", "route_fit_through_cluster", "default_checkpoint_dir", "DEFAULT_DIR",
           "FINISH_TIMEOUT_SECS"]
