"""Data: real data sets that need no download, and how input becomes each worker's pipeline.

- :mod:`.loaders`: the UCI digits shipped in scikit-learn, MNIST and
  Fashion-MNIST from their IDX files, per-worker shards as ``tf.data``;
- :mod:`.pipeline`: big numpy arrays kept out of the graph; pipelines without tf.data's autotune thread.

``from tfcluster import data`` gives the loaders' names (``data.load``,
``data.DataSet``...), as the examples use them.
"""

from ..core.errors import DataError  # noqa: F401  (what a bad data file raises)
from .loaders import MNIST_FILES, DataSet, load, load_digits, load_mnist, read_idx, shard, to_dataset, write_idx  # noqa: F401
from .pipeline import OUTSIDE_GRAPH_BYTES, arrays_outside_the_graph, without_autotune_thread  # noqa: F401
