"""TF2 mode: a ``tf.distribute`` program of TF 2.0-2.15 runs unchanged on TensorFlow 2.21, one model across the cluster.

``python -m tfcluster.tf2 script.py ARGS`` (or ``tfcluster start/local --tf2``)
runs the script as ``__main__`` after :func:`install`, which makes

- ``tf.keras`` Keras 2 (tf-keras, ``TF_USE_LEGACY_KERAS=1``) where the
  ``legacy`` extra is installed, as TF 2.0-2.15 programs were written for;
- the ``tf.distribute`` names TF removed since 2.0 work again (:mod:`.names`);
- ``MirroredStrategy``, ``CentralStorageStrategy`` and ``OneDeviceStrategy``
  one model over every trainer of TF_CONFIG's cluster (:mod:`.strategies`),
  and a trainer that trains a private copy there say so once;
- the collective runtime ready from the program's first line, so data and models may come before
  the strategy (:mod:`.collectives`);
- what Keras prints mid-epoch on several trainers is what one process prints (:mod:`.progress`);
- a non-chief trainer's checkpoints and SavedModels written aside, so the chief's do not race
  (:mod:`.checkpoints`);
- a worker or ps left in ``server.join()`` (TF 2's ParameterServerStrategy) ends with its chief
  (:mod:`.servers`);
- a trainer whose all-reduce group lost a member says so in one line naming it, exit 3 (:mod:`.faults`);
- without tf-keras, what Keras 3 lacks of Keras 2 is one line naming the ``legacy`` extra (:mod:`.keras3`);
- SIGTERM ends a trainer at once, which TF's coordination service would take for itself (:mod:`.preemption`).

docs/tf2.md lists what the mode covers. Importing this package does not import
TensorFlow. Its modules: :mod:`.strategies` (the cluster's strategies),
:mod:`.names` (the table of names and their patches), :mod:`.collectives`
(the collective runtime from the first op), :mod:`.progress` (Keras's mid-epoch values), :mod:`.checkpoints`
(a non-chief's writes aside), :mod:`.servers` (``join()`` until the chief
ends), :mod:`.faults` (a lost trainer in one line), :mod:`.keras3` (Keras 2's
names under Keras 3), :mod:`.preemption` (SIGTERM given back), ``__main__``
(``python -m tfcluster.tf2 script.py``).
"""

import sys

from ..topology.taskenv import prepare_this_process

__all__ = ["install", "tf2_command"]

_installed = False


def install():
    """Serve TF2 mode in this process (once): Keras 2 where installed, TF's removed names, the cluster's strategies.

    Call it before the program imports TensorFlow (Keras 2 is chosen at TF's import); it imports TensorFlow.
    """
    global _installed
    if _installed:
        return
    if "tensorflow" not in sys.modules:
        prepare_this_process()          # TF_USE_LEGACY_KERAS=1 where tf-keras is installed, quiet C++ logs
    from ..topology.taskenv import import_tensorflow
    import_tensorflow()
    from ..core import patches
    from ..topology.cluster import Cluster
    from . import checkpoints, collectives, names, preemption, progress, servers, strategies
    cluster = Cluster.from_environment()           # read once here, handed to the patches that need it
    for name in names.PATCHES + collectives.PATCHES + progress.PATCHES + servers.PATCHES + preemption.PATCHES:
        patches.install(name)
    for name in strategies.PATCHES + collectives.CLUSTER_PATCHES + checkpoints.PATCHES:
        patches.install(name, cluster)
    names.refuse_estimator_packages()
    collectives.configure(cluster)
    _installed = True


def tf2_command(command) -> list:
    """Rewrite ``python [OPTS] script.py ARGS`` to ``python [OPTS] -m tfcluster.tf2 script.py ARGS``."""
    from ..core.programs import mode_command
    return mode_command(command, "tfcluster.tf2", "--tf2")
