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

from ..core.errors import SpecError

log = logging.getLogger("tfcluster")

#: The methods of the program's model that run on the model of towers.
DELEGATED = ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch", "fit_generator",
             "evaluate_generator", "predict_generator")


def _split(x, n: int):
    """``x`` cut along the batch into ``n`` parts whose sizes differ by one at most (the first ones larger)."""
    import tensorflow as tf
    size = tf.shape(x)[0]
    sizes = tf.stack([(size + n - 1 - k) // n for k in range(n)])
    return tf.split(x, sizes, num=n)


def tower_model(model, devices: list):
    """A model of ``len(devices)`` towers over ``model``'s layers (see the module doc), not compiled."""
    import tensorflow as tf
    import tf_keras
    if not model.inputs:
        raise SpecError("compile(distribute=...) with several replicas splits the model's inputs, which a model "
                        "without an input shape does not have yet; give its first layer an input_shape")
    inputs = [tf_keras.layers.Input(batch_shape=t.shape, dtype=t.dtype, name=name)
              for t, name in zip(model.inputs, model.input_names)]
    parts = [_split(x, len(devices)) for x in inputs]
    towers = []
    for k, device in enumerate(devices):
        with tf.compat.v1.device(device), tf.compat.v1.name_scope(f"tower_{k}"):
            out = model([p[k] for p in parts] if len(parts) > 1 else parts[0][k])
        towers.append(out if isinstance(out, (list, tuple)) else [out])
    # Named as the program's outputs, so its losses, metrics and their names apply unchanged.
    outputs = [tf_keras.layers.Lambda(lambda t: t, name=name)(tf.concat([t[i] for t in towers], 0))
               for i, name in enumerate(model.output_names)]
    return tf_keras.Model(inputs, outputs if len(outputs) > 1 else outputs[0], name=f"{model.name}_towers")


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
