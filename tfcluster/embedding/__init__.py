"""Embedding variables: tables keyed by id on the ps that grow with the ids, admit and evict rows.

:mod:`.options` holds what a variable is told (DeepRec's option names),
:mod:`.variable` the variable, its parts on the ps and its lookup,
:mod:`.updates` how TF 1.x optimizers train it, and :mod:`.saving` how each
part saves and restores itself, evicting as it saves. docs/embeddings.md,
"Embedding variables", says what is served and how it is measured.
"""

from typing import Optional

from .options import (CBFFilter, CounterFilter, EmbeddingVariableOption, GlobalStepEvict, InitializerOption,
                      L2WeightEvict)
from .variable import EmbeddingVariable, embedding_variables

__all__ = ["get_embedding_variable", "embedding_lookup", "EmbeddingVariable", "EmbeddingVariableOption",
           "InitializerOption", "CounterFilter", "CBFFilter", "GlobalStepEvict", "L2WeightEvict",
           "embedding_variables"]


def get_embedding_variable(name: str, embedding_dim: int, key_dtype=None, initializer=None, trainable: bool = True,
                           partitions: Optional[int] = None, ev_option=None, devices=None,
                           seed=None) -> EmbeddingVariable:
    """An embedding variable of ``embedding_dim``-float rows, split by id over ``partitions`` parts (default: one
    per ps where the graph places variables on the ps, else one); its saveables join the graph's, and TF 1.x
    optimizers learn to train it."""
    import tensorflow as tf
    from . import saving, updates
    updates.install()
    saving.install()
    variable = EmbeddingVariable(name, embedding_dim, key_dtype=key_dtype, initializer=initializer,
                                 ev_option=ev_option, parts=partitions, devices=devices, trainable=trainable,
                                 seed=seed)
    for part in variable.parts:
        variable.graph.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, saving.saveable(part))
    return variable


def embedding_lookup(variable: EmbeddingVariable, ids, name=None):
    """The rows of ``ids`` in ``variable`` (shape ``ids.shape + [embedding_dim]``)."""
    return variable.lookup(ids, name=name)
