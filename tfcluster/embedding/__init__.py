"""Embedding variables: tables keyed by id on the ps that grow with the ids, admit and evict rows.

:mod:`.options` holds what a variable is told (DeepRec's option names),
:mod:`.variable` the variable, its parts on the ps and its lookup,
:mod:`.updates` how TF 1.x optimizers train it, :mod:`.saving` how each
part saves and restores itself, evicting as it saves, :mod:`.increments`
the saves of only the rows written since the last one, :mod:`.create` the
function that makes one with all of that, and :mod:`.columns` the feature
columns and sparse lookups over them. docs/embeddings.md,
"Embedding variables", says what is served and how it is measured.
"""

from .options import (CBFFilter, CounterFilter, EmbeddingVariableOption, GlobalStepEvict, InitializerOption,
                      L2WeightEvict)
from .create import embedding_lookup, get_embedding_variable
from .variable import EmbeddingVariable, embedding_variables

__all__ = ["get_embedding_variable", "embedding_lookup", "EmbeddingVariable", "EmbeddingVariableOption",
           "InitializerOption", "CounterFilter", "CBFFilter", "GlobalStepEvict", "L2WeightEvict",
           "embedding_variables"]
