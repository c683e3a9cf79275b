"""Making an embedding variable: the variable, its parts' saveables in the graph's, and TF 1.x optimizers taught it."""

from typing import Optional

from .variable import EmbeddingVariable, embedding_variables, tensorflow_v2


def get_embedding_variable(name: str, embedding_dim: int, key_dtype=None, initializer=None, trainable: bool = True,
                           partitions: Optional[int] = None, ev_option=None, devices=None,
                           seed=None) -> EmbeddingVariable:
    """An embedding variable of ``embedding_dim``-float rows, split by id over ``partitions`` parts (default: one
    per ps where the graph places variables on the ps, else one); its saveables join the graph's, and TF 1.x
    optimizers learn to train it."""
    tf = tensorflow_v2()
    tf1 = tf.compat.v1
    from . import increments, saving, updates
    updates.install()
    increments.install()
    scope = tf1.get_variable_scope()
    full = f"{scope.name}/{name}" if scope.name else name
    known = [v for v in embedding_variables(tf1.get_default_graph()) if v.name == full]
    if known and scope.reuse:       # a second tower or an eval graph over the same tables (reuse=True)
        return known[0]
    with tf1.variable_scope(scope) as own:
        own.set_partitioner(None)           # its parts are by id, not TF's slices of its stand-ins
        variable = EmbeddingVariable(name, embedding_dim, key_dtype=key_dtype, initializer=initializer,
                                     ev_option=ev_option, parts=partitions, devices=devices, trainable=trainable,
                                     seed=seed)
    for part in variable.parts:
        variable.graph.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, saving.saveable(part))
    return variable


def embedding_lookup(variable: EmbeddingVariable, ids, name=None):
    """The rows of ``ids`` in ``variable`` (shape ``ids.shape + [embedding_dim]``)."""
    return variable.lookup(ids, name=name)
