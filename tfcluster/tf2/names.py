"""The ``tf.distribute`` names TF removed or renamed since 2.0, as TF2 mode serves them (docs/tf2.md's table).

Each :class:`Name` is one row: the name a TF 2.0-2.15 program uses, the release
that took it away, and what TF2 mode gives it. The names TF 2.21 no longer has
are served again by patches that add them (``Patch(adds=True)``,
:mod:`tfcluster.core.patches`); :mod:`.strategies` makes the one-process
strategies the cluster's. The Estimator's names (``tf.estimator``,
``tensorflow_estimator``, TF 2.0-2.3's ``ParameterServerStrategy()``) are TF1
mode's, where tfcluster's Estimator runs: here each is one line naming ``--tf1``.
tests/test_tf2.py runs one program line per row.
"""

import importlib.abc
import sys
import types
from dataclasses import dataclass

from ..core.errors import TF1ModeImport, TF1ModeName
from ..core.patches import Patch, register

_LIB = "tensorflow.python.distribute.distribute_lib"


@dataclass(frozen=True)
class Name:
    """One row of docs/tf2.md: a name of TF 2.0-2.15's ``tf.distribute``, what became of it, and TF2 mode's answer."""
    name: str           #: as programs write it
    since: str          #: the release that removed or renamed it ("" for a name TF 2.21 still has)
    tf_221: str         #: what TF 2.21 does with it
    served: str         #: what TF2 mode gives
    example: str        #: one program line that uses it (tests/test_tf2.py runs each, ``strategy`` in scope)


def _estimator_line(name: str, why: str = "TensorFlow 2.16 removed it") -> str:
    """Why the Estimator's names are TF1 mode's: said where a TF 2 program reaches for them."""
    return (f"{name}: {why}, and tfcluster's Estimator (graph mode, as TF 2's Estimator was) runs in TF1 mode: run "
            "the program with --tf1 (tfcluster local --tf1 ..., or python -m tfcluster.tf1 script.py), where a TF 2 "
            "program's Estimator and its strategy train as written (docs/tf2.md)")


_ESTIMATOR_LINE = _estimator_line("tf.estimator")


class EstimatorPackages(importlib.abc.MetaPathFinder):
    """``import tensorflow_estimator`` (or TF 1.13's ``tensorflow.python.estimator``) in TF2 mode: one line naming
    ``--tf1``, where TF's would fail deep inside (it needs TF internals 2.16 removed)."""

    def find_spec(self, fullname, path=None, target=None):
        """Refuse the Estimator's packages; leave every other import alone."""
        for package in ("tensorflow_estimator", "tensorflow.python.estimator"):
            if fullname == package or fullname.startswith(package + "."):
                raise TF1ModeImport(_estimator_line(package, "it does not import on TensorFlow 2.21 (it needs what "
                                                             "2.16 removed)"))
        return None


def refuse_estimator_packages():
    """Install :class:`EstimatorPackages` (once): TF2 mode's answer to an import of the Estimator's package."""
    if not any(isinstance(finder, EstimatorPackages) for finder in sys.meta_path):
        sys.meta_path.insert(0, EstimatorPackages())


_PS_LINE = ("tf.distribute.experimental.ParameterServerStrategy() without a cluster resolver is TF 2.0-2.3's, which "
            "trained an Estimator only: run the program with --tf1 (tfcluster local --tf1 --chief --ps 1 ...), where "
            "it trains the Estimator on the ps tasks; TF 2.4's takes a cluster resolver and a ClusterCoordinator "
            "(docs/tf2.md)")


class _EstimatorInTF1Mode(types.ModuleType):
    """``tf.estimator`` in TF2 mode: any name of it is one line naming ``--tf1``."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise TF1ModeName(_ESTIMATOR_LINE)


def _estimator(_):
    return _EstimatorInTF1Mode("tensorflow.estimator", "TF2 mode: the Estimator is TF1 mode's (--tf1).")


def _tf20_parameter_server(original):
    def __init__(self, cluster_resolver=None, *args, **kwargs):
        if cluster_resolver is None:
            raise TF1ModeName(_PS_LINE)
        return original(self, cluster_resolver, *args, **kwargs)
    return __init__


def _run_v2(_):
    def experimental_run_v2(self, fn, args=(), kwargs=None, options=None):
        """TF 2.0-2.1's name of :meth:`run` (deprecated in 2.2, removed in 2.4)."""
        return self.run(fn, args=args, kwargs=kwargs, options=options)
    return experimental_run_v2


def _numpy_dataset(_):
    def experimental_make_numpy_dataset(self, numpy_input, session=None):
        """TF 2.0-2.3's dataset of numpy arrays for a strategy (removed from TF 2's Strategy in 2.4)."""
        make = getattr(self.extended, "experimental_make_numpy_dataset", None)
        if make is not None:
            return make(numpy_input, session=session)
        import tensorflow as tf
        return tf.data.Dataset.from_tensor_slices(numpy_input)
    return experimental_make_numpy_dataset


register(Patch("tf2.experimental_run_v2", f"{_LIB}:StrategyBase.experimental_run_v2",
               "TF 2.0-2.3 programs call strategy.experimental_run_v2, removed in TF 2.4: it is run", _run_v2,
               "TF2 mode", adds=True))
register(Patch("tf2.experimental_make_numpy_dataset", f"{_LIB}:Strategy.experimental_make_numpy_dataset",
               "TF 2.0-2.3 programs make their numpy input with it; TF 2.4 took it from TF 2's Strategy",
               _numpy_dataset, "TF2 mode", adds=True))
register(Patch("tf2.estimator_in_tf1_mode", "tensorflow:estimator",
               "TF 2.16 removed tf.estimator; a TF 2 program that uses it is told in one line to run in TF1 mode",
               _estimator, "TF2 mode", adds=True))
register(Patch("tf2.tf20_parameter_server", "tensorflow.python.distribute.parameter_server_strategy_v2:"
               "ParameterServerStrategyV2.__init__",
               "TF 2.0-2.3's ParameterServerStrategy() (the Estimator's) is one line naming TF1 mode, not a TypeError",
               _tf20_parameter_server, "TF2 mode", params=("self", "cluster_resolver")))

#: Every patch of this module TF2 mode installs.
PATCHES = ("tf2.experimental_run_v2", "tf2.experimental_make_numpy_dataset", "tf2.estimator_in_tf1_mode",
           "tf2.tf20_parameter_server")

#: docs/tf2.md's table of names, one test each.
NAMES = (
    Name("Strategy.experimental_run_v2(fn, args)", "2.4 (deprecated in 2.2)", "AttributeError",
         "`Strategy.run`", "strategy.experimental_run_v2(lambda x: x * 2.0, args=(tf.constant(1.0),))"),
    Name("Strategy.experimental_make_numpy_dataset(arrays)", "2.4", "AttributeError",
         "the strategy's own dataset of the arrays (TF 2.3's)",
         "strategy.experimental_make_numpy_dataset(np.arange(4.0)).batch(2)"),
    Name("Strategy.experimental_distribute_datasets_from_function(fn)", "2.4 (renamed)",
         "deprecated alias of `distribute_datasets_from_function`", "TF's (it works)",
         "strategy.experimental_distribute_datasets_from_function(lambda ctx: tf.data.Dataset.range(4).batch(2))"),
    Name("tf.distribute.experimental.MultiWorkerMirroredStrategy(communication=...)", "2.4 (renamed)",
         "deprecated alias of `tf.distribute.MultiWorkerMirroredStrategy`", "TF's (it works)",
         "tf.distribute.experimental.MultiWorkerMirroredStrategy("
         "communication=tf.distribute.experimental.CollectiveCommunication.RING)"),
    Name("tf.distribute.experimental.CollectiveCommunication", "2.4 (renamed)",
         "alias of `CommunicationImplementation`", "TF's (it works)",
         "tf.distribute.experimental.CollectiveCommunication.AUTO"),
    Name("tf.distribute.experimental.CentralStorageStrategy()", "", "one process's devices",
         "one model over the cluster's trainers (below)", "tf.distribute.experimental.CentralStorageStrategy()"),
    Name("tf.distribute.MirroredStrategy()", "", "one process's devices",
         "one model over the cluster's trainers (below)", "tf.distribute.MirroredStrategy()"),
    Name("tf.distribute.OneDeviceStrategy(device)", "", "one device of one process",
         "one device of each trainer, all-reduced (below)", "tf.distribute.OneDeviceStrategy('/cpu:0')"),
    Name("Strategy.experimental_local_results(value)", "", "TF's", "TF's (it works)",
         "strategy.experimental_local_results(strategy.run(lambda: tf.constant(1.0)))"),
    Name("Strategy.reduce(op, value, axis)", "", "TF's (TF 2.0 required `axis`; it still takes it)",
         "TF's (it works)", "strategy.reduce(tf.distribute.ReduceOp.SUM, tf.constant([1.0, 2.0]), axis=0)"),
    Name("tf.estimator", "2.16", "AttributeError", "one line naming `--tf1`, where tfcluster's Estimator runs "
         "the program (below)", "tf.estimator.RunConfig()"),
    Name("import tensorflow_estimator", "2.16 (the package fails to import since)", "ImportError",
         "one line naming `--tf1`", "__import__('tensorflow_estimator')"),
    Name("tf.distribute.experimental.ParameterServerStrategy()", "2.4 (needs a cluster resolver since)",
         "TypeError", "one line naming `--tf1`, where it trains the Estimator on the ps (below)",
         "tf.distribute.experimental.ParameterServerStrategy()"),
)


def table() -> str:
    """docs/tf2.md's table of names (tests/test_tf2.py checks the page holds it)."""
    rows = ["| name (as programs write it) | removed or renamed in | TF 2.21 | TF2 mode |", "|---|---|---|---|"]
    rows += [f"| `{n.name}` | {n.since} | {n.tf_221} | {n.served} |" for n in NAMES]
    return "\n".join(rows) + "\n"
