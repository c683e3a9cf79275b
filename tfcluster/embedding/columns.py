"""Embedding variables behind TF's feature columns and sparse lookups, as DeepRec's names use them.

``categorical_column_with_embedding(key, dtype, partition_num, ev_option)``
is a categorical column whose ids are the feature's values themselves (ints,
or strings), with no vocabulary or bucket count; ``embedding_column`` over it
looks its ids up in an embedding variable made where TF's would make its
``embedding_weights`` (so under ``input_layer/<column>_embedding/``) and
combines each example's rows as TF does (``mean``, ``sum``, ``sqrtn``, an
example with no id reads zeros). A linear model over such a column is refused
in one line: it has no rows to give a weight each.
"""

from ..core.errors import SpecError
from .variable import EmbeddingVariable, tensorflow_v2

#: A stand-in bucket count for TF's code that asks: no table of this size is ever made.
NO_BUCKETS = 2 ** 62


def embedding_lookup_sparse(variable: EmbeddingVariable, sp_ids, sp_weights=None, combiner: str = "mean",
                            name=None):
    """Each row of ``sp_ids`` (a 2-D SparseTensor of ids) combined over its ids' rows; zeros for a row with none."""
    tf = tensorflow_v2()
    if combiner not in ("sum", "mean", "sqrtn"):
        raise SpecError(f"embedding variable {variable.name}: combiner must be sum, mean or sqrtn, not {combiner!r}")
    with tf.name_scope(name or "embedding_lookup_sparse"):
        rows = variable.lookup(sp_ids.values)
        example = tf.cast(sp_ids.indices[:, 0], tf.int32)
        examples = tf.cast(sp_ids.dense_shape[0], tf.int32)
        weights = tf.ones_like(sp_ids.values, tf.float32) if sp_weights is None else \
            tf.cast(sp_weights.values, tf.float32)
        total = tf.math.unsorted_segment_sum(rows * weights[:, None], example, examples)
        if combiner == "sum":
            return total
        norm = weights if combiner == "mean" else tf.square(weights)
        norm = tf.math.unsorted_segment_sum(norm, example, examples)
        norm = norm if combiner == "mean" else tf.sqrt(norm)
        return tf.math.divide_no_nan(total, norm[:, None])


def _classes():
    from tensorflow.python.feature_column import feature_column_v2 as fc
    from tensorflow.python.framework import sparse_tensor

    class EmbeddingCategoricalColumn(fc.HashedCategoricalColumn):
        """A categorical column whose values are its ids, looked up in an embedding variable (DeepRec's)."""

        def __new__(cls, key, dtype, partition_num=None, ev_option=None):
            column = super().__new__(cls, key, NO_BUCKETS, dtype)
            column.__dict__.update(partition_num=partition_num, ev_option=ev_option)
            return column

        def _transform_input_tensor(self, input_tensor):
            tf = tensorflow_v2()
            if not isinstance(input_tensor, sparse_tensor.SparseTensor):
                raise SpecError(f"column {self.key}: its input must be a SparseTensor")
            if (input_tensor.dtype == tf.string) != (self.dtype == tf.string):
                raise SpecError(f"column {self.key} holds {self.dtype.name} ids, and its feature is "
                                f"{input_tensor.dtype.name}")
            values = input_tensor.values if input_tensor.dtype == tf.string else tf.cast(input_tensor.values,
                                                                                       tf.int64)
            return sparse_tensor.SparseTensor(input_tensor.indices, values, input_tensor.dense_shape)

        @property
        def num_buckets(self):
            """No bucket count: a linear model over the column, which needs one, is refused."""
            raise SpecError(f"column {self.key} (categorical_column_with_embedding) is looked up through "
                            f"embedding_column; a linear model over it is not served")

    class EmbeddingVariableColumn(fc.EmbeddingColumn):
        """``embedding_column`` over an :class:`EmbeddingCategoricalColumn`: its rows in an embedding variable."""

        def create_state(self, state_manager):
            """Nothing: the variable is made when the column is first looked up."""

        def _lookup(self, sparse_tensors, trainable=True):
            from .create import get_embedding_variable
            column = self.categorical_column
            variable = get_embedding_variable(
                "embedding_weights", self.dimension, key_dtype=column.dtype, initializer=self.initializer,
                trainable=self.trainable and trainable, partitions=column.partition_num, ev_option=column.ev_option)
            return embedding_lookup_sparse(variable, sparse_tensors.id_tensor, sparse_tensors.weight_tensor,
                                           combiner=self.combiner, name=f"{self.name}_weights")

        def _get_dense_tensor_internal(self, sparse_tensors, state_manager):
            return self._lookup(sparse_tensors)

        def _old_get_dense_tensor_internal(self, sparse_tensors, weight_collections, trainable):
            return self._lookup(sparse_tensors, trainable if trainable is not None else True)

    return EmbeddingCategoricalColumn, EmbeddingVariableColumn


_CLASSES = []


def classes():
    """``(EmbeddingCategoricalColumn, EmbeddingVariableColumn)``, made once TensorFlow is imported."""
    if not _CLASSES:
        _CLASSES.extend(_classes())
    return tuple(_CLASSES)


def categorical_column_with_embedding(key: str, dtype=None, partition_num=None, ev_option=None):
    """DeepRec's column: the values of feature ``key`` are its ids (strings by default, or ints)."""
    tf = tensorflow_v2()
    dtype = tf.as_dtype(dtype or tf.string)
    if dtype not in (tf.string, tf.int64, tf.int32):
        raise SpecError(f"column {key}: dtype must be tf.string, tf.int64 or tf.int32, not {dtype.name}")
    return classes()[0](key, tf.int64 if dtype == tf.int32 else dtype, partition_num, ev_option)


def embedding_column(original):
    """TF's ``embedding_column`` that, over a :func:`categorical_column_with_embedding`, looks its ids up in an
    embedding variable."""
    def embedding_column(categorical_column, dimension, combiner="mean", initializer=None, ckpt_to_load_from=None,
                         tensor_name_in_ckpt=None, max_norm=None, trainable=True, use_safe_embedding_lookup=True):
        if not isinstance(categorical_column, classes()[0]):
            return original(categorical_column, dimension, combiner=combiner, initializer=initializer,
                            ckpt_to_load_from=ckpt_to_load_from, tensor_name_in_ckpt=tensor_name_in_ckpt,
                            max_norm=max_norm, trainable=trainable,
                            use_safe_embedding_lookup=use_safe_embedding_lookup)
        if ckpt_to_load_from is not None or max_norm is not None:
            raise SpecError(f"embedding_column over {categorical_column.key}: ckpt_to_load_from and max_norm are "
                            f"not served for embedding variables")
        return classes()[1](categorical_column, dimension, combiner, initializer, None, None, None, trainable,
                            use_safe_embedding_lookup)
    embedding_column.__doc__ = original.__doc__
    return embedding_column
