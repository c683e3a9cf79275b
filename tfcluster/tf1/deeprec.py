"""DeepRec's embedding-variable names in TF1 mode, so a DeepRec program's embedding variables run unchanged.

``tf.get_embedding_variable``, ``tf.EmbeddingVariableOption`` and its options
(``InitializerOption``, ``CounterFilter``, ``CBFFilter``, ``GlobalStepEvict``,
``L2WeightEvict``), ``tf.feature_column.categorical_column_with_embedding``
with ``embedding_column`` over it, and ``tf.nn.embedding_lookup`` /
``embedding_lookup_sparse`` / ``safe_embedding_lookup_sparse`` of an embedding
variable, all served by :mod:`tfcluster.embedding` (DeepRec-AI/DeepRec
docs/docs_en/Embedding-Variable.md lists them). DeepRec's storage tiers and
other options of its own are refused in one line.
"""

from .. import embedding
from ..core.errors import SpecError
from ..embedding import columns
from .overrides import Proxy

#: DeepRec's option classes, served at the top of ``tensorflow`` as DeepRec has them.
OPTIONS = ("EmbeddingVariableOption", "InitializerOption", "CounterFilter", "CBFFilter", "GlobalStepEvict",
           "L2WeightEvict")


def get_embedding_variable(name, embedding_dim, key_dtype=None, value_dtype=None, initializer=None,
                           regularizer=None, trainable=True, collections=None, caching_device=None, partitioner=None,
                           validate_shape=True, custom_getter=None, constraint=None, init_data_source=None,
                           ev_option=None):
    """DeepRec's ``tf.get_embedding_variable``: an embedding variable, in as many parts as ``partitioner`` asks."""
    import tensorflow as tf
    for given, what in ((value_dtype not in (None, tf.float32), "value_dtype other than float32"),
                        (regularizer is not None, "regularizer"), (init_data_source is not None, "init_data_source"),
                        (custom_getter is not None, "custom_getter"), (constraint is not None, "constraint")):
        if given:
            raise SpecError(f"get_embedding_variable({name!r}): {what} is not served for embedding variables")
    parts = None
    if partitioner is not None:     # TF's partitioners give slices of a shape; here, one part per slice
        parts = int(partitioner(shape=tf.TensorShape([1 << 20, embedding_dim]), dtype=tf.float32)[0])
    return embedding.get_embedding_variable(name, embedding_dim, key_dtype=key_dtype, initializer=initializer,
                                            trainable=trainable, partitions=parts, ev_option=ev_option)


def _lookups(nn):
    def embedding_lookup(params, ids, *args, name=None, **kwargs):
        if isinstance(params, embedding.EmbeddingVariable):
            return params.lookup(ids, name=name)
        return nn.embedding_lookup(params, ids, *args, name=name, **kwargs)

    def embedding_lookup_sparse(params, sp_ids, sp_weights, *args, combiner=None, name=None, **kwargs):
        if isinstance(params, embedding.EmbeddingVariable):
            return columns.embedding_lookup_sparse(params, sp_ids, sp_weights, combiner or "mean", name)
        return nn.embedding_lookup_sparse(params, sp_ids, sp_weights, *args, combiner=combiner, name=name,
                                          **kwargs)

    def safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights=None, combiner="mean",
                                     default_id=None, name=None, **kwargs):
        if isinstance(embedding_weights, embedding.EmbeddingVariable):
            return columns.embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights, combiner, name)
        return nn.safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights, combiner=combiner,
                                               default_id=default_id, name=name, **kwargs)
    return dict(embedding_lookup=embedding_lookup, embedding_lookup_sparse=embedding_lookup_sparse,
                safe_embedding_lookup_sparse=safe_embedding_lookup_sparse)


def nn(v1):
    """``tf.nn`` whose embedding lookups also take an embedding variable."""
    return Proxy(v1.nn, **_lookups(v1.nn))


def feature_column(v1):
    """``tf.feature_column`` with DeepRec's ``categorical_column_with_embedding``."""
    real = v1.feature_column
    return Proxy(real, categorical_column_with_embedding=columns.categorical_column_with_embedding,
                  embedding_column=columns.embedding_column(real.embedding_column))


def overrides() -> dict:
    """TF1 mode's names for DeepRec's API: ``{name: function of tf.compat.v1 making the value}``."""
    names = {"get_embedding_variable": lambda v1: get_embedding_variable, "nn": nn,
             "feature_column": feature_column}
    names.update({option: (lambda v1, option=option: getattr(embedding, option)) for option in OPTIONS})
    return names
