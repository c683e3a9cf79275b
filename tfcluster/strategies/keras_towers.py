"""A tf-keras model as towers in one graph: each batch split over devices, one tower of the model per device.

The towers share the model's layers, so its weights; each runs on its own
device (a GPU, or a virtual CPU device) on its part of the batch, and their
outputs are concatenated again, named as the model's, so its losses and
metrics apply unchanged to the whole batch. Keras's compile (TF1 mode's
``compile(distribute=...)``, :mod:`tfcluster.keras.towers`) and
``model_to_estimator``'s ``model_fn`` (:mod:`tfcluster.estimator.keras`) train
on it: one update per step from every tower, equal to one process on the batch.
"""

from ..core.errors import SpecError


def _split(x, n: int):
    """``x`` cut along the batch into ``n`` parts whose sizes differ by one at most (the first ones larger)."""
    import tensorflow as tf
    size = tf.shape(x)[0]
    sizes = tf.stack([(size + n - 1 - k) // n for k in range(n)])
    return tf.split(x, sizes, num=n)


def tower_model(model, devices: list, tensors=None):
    """A model of ``len(devices)`` towers over ``model``'s layers (see the module doc), not compiled.

    ``tensors``: the graph's tensors to take as inputs (an Estimator's
    features), one per model input; else new placeholders.
    """
    import tensorflow as tf
    import tf_keras
    if not model.inputs:
        raise SpecError("compile(distribute=...) with several replicas splits the model's inputs, which a model "
                        "without an input shape does not have yet; give its first layer an input_shape")
    if tensors is None:
        inputs = [tf_keras.layers.Input(batch_shape=t.shape, dtype=t.dtype, name=name)
                  for t, name in zip(model.inputs, model.input_names)]
    else:
        inputs = [tf_keras.layers.Input(tensor=t, name=name) for t, name in zip(tensors, model.input_names)]
    # The split is a layer: raw tf ops on Keras inputs make tf-keras evaluate their constants in its own
    # session, which initialises every variable there, and on a cluster fails on a remote device.
    n = len(devices)
    parts = [tf_keras.layers.Lambda(lambda t: _split(t, n), name=f"split_{i}")(x) for i, x in enumerate(inputs)]
    towers = []
    for k, device in enumerate(devices):
        with tf.compat.v1.device(device), tf.compat.v1.name_scope(f"tower_{k}"):
            out = model([p[k] for p in parts] if len(parts) > 1 else parts[0][k])
        towers.append(out if isinstance(out, (list, tuple)) else [out])
    # Named as the program's outputs, so its losses, metrics and their names apply unchanged.
    outputs = [tf_keras.layers.Lambda(lambda parts: tf.concat(parts, 0), name=name)([t[i] for t in towers])
               for i, name in enumerate(model.output_names)]
    return tf_keras.Model(inputs, outputs if len(outputs) > 1 else outputs[0], name=f"{model.name}_towers")
