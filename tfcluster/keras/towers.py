"""A compiled tf-keras model on several devices of one process: ``compile(distribute=MirroredStrategy(num_gpus=N))``.

TF 1.11-1.13's Keras split each step over the strategy's replicas, one tower
per device, and made one update from all of them. Here :func:`use_towers`
builds, beside the program's model, a model of towers that shares its layers
and weights: the batch fed to a step is split into N nearly equal parts, the
program's model runs on each part on its own device (N GPUs, else N virtual
CPU devices, as tfcluster's towers make them), and the outputs are
concatenated again. It is compiled with the program's own compile arguments
(the same optimizer object, so ``optimizer.iterations`` counts its updates),
and the program's ``fit``, ``evaluate`` and ``predict`` (and their
``*_on_batch`` and ``*_generator`` forms) run on it. The loss is the program's
over the whole batch, so an update equals one process's on the same batch.

The batch is the global batch, split over the towers: TF 1.14's rule
(TF 1.11-1.13 fed each replica a whole batch of a dataset), so that a program
computes the same updates with or without GPUs. Gradients are computed
beside each tower's operations (tf-keras differentiates with
``colocate_gradients_with_ops``). Batch normalisation normalises each tower's
part, as TensorFlow's MirroredStrategy did. The session tf-keras uses gets the
virtual CPU devices; a model whose input shape is known only from the data
cannot be split before ``fit`` and is refused in one line.
"""

import logging

from ..strategies.keras_towers import tower_model

log = logging.getLogger("tfcluster")

#: The methods of the program's model that run on the model of towers.
DELEGATED = ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch", "fit_generator",
             "evaluate_generator", "predict_generator")


def use_towers(model, towers, compile_args: tuple, compile_kwargs: dict):
    """Run ``model``'s fit, evaluate and predict on a model of ``towers`` (a :class:`Towers`) compiled as it was."""
    import tensorflow as tf
    from tf_keras.src import backend
    config = towers.configure(tf.compat.v1.ConfigProto(allow_soft_placement=True))
    if towers.virtual:
        # A local session has the virtual CPU devices its config asks for; tf-keras's default has one.
        backend.set_session(tf.compat.v1.Session(graph=backend.get_graph(), config=config))
    split = tower_model(model, towers.local_devices)
    split.compile(*compile_args, **compile_kwargs)
    # tf-keras wraps a tf.train optimizer anew in each compile: the program's model reads the one that updates.
    model.optimizer = split.optimizer
    for name in DELEGATED:
        setattr(model, name, getattr(split, name))
    log.info("%s runs on %s: each batch split over them, one update per step", model.name, towers.describe())
    return split
