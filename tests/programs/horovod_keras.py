"""Horovod's examples/tensorflow/tensorflow_keras_mnist.py as Horovod 0.16-0.19 wrote it (TF 1.x graph tf.keras).

``hvd.init()``, a GPU pinned by local rank through ``K.set_session``, an
optimizer's rate scaled by the size and wrapped in ``hvd.DistributedOptimizer``,
``BroadcastGlobalVariablesCallback(0)``, ``MetricAverageCallback``,
``LearningRateWarmupCallback`` and ``LearningRateScheduleCallback`` (Horovod's
keras_mnist_advanced.py), ``ModelCheckpoint`` on rank 0 alone, and the last
checkpoint loaded back with ``hvd.load_model``. Its data are generated (no
download). Prints the GPUs the task got and the ``visible_device_list`` its
session runs with, then, per epoch, the rate and the averaged loss each rank's
callbacks saw, the optimizer class ``load_model`` gave back, and writes
``--out/weights-<rank>.npz``.
"""

import argparse
import os

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import backend as K
from tensorflow.keras.layers import Dense
from tensorflow.keras.models import Sequential

import horovod.tensorflow.keras as hvd

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--epochs", type=int, default=4)
args = p.parse_args()

hvd.init()
config = tf.ConfigProto()
config.gpu_options.allow_growth = True
config.gpu_options.visible_device_list = str(hvd.local_rank())
K.set_session(tf.Session(config=config))
print("rank {}: CUDA_VISIBLE_DEVICES={}, the session's visible_device_list={!r}".format(
    hvd.rank(), os.environ.get("CUDA_VISIBLE_DEVICES"), K.get_session()._config.gpu_options.visible_device_list),
    flush=True)

rng = np.random.RandomState(hvd.rank())          # each rank its own data, as Horovod's examples shuffle apart
x_train = rng.rand(512, 16).astype("float32")
y_train = keras.utils.to_categorical((x_train.sum(axis=1) > 8).astype("int64"), 2)

model = Sequential([Dense(16, activation="relu", input_shape=(16,)), Dense(2, activation="softmax")])
opt = keras.optimizers.SGD(lr=0.05 * hvd.size(), momentum=0.9)
opt = hvd.DistributedOptimizer(opt)
model.compile(loss=keras.losses.categorical_crossentropy, optimizer=opt, metrics=["accuracy"])

callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(warmup_epochs=2, verbose=1),
    hvd.callbacks.LearningRateScheduleCallback(start_epoch=2, multiplier=0.5),
]
checkpoint = os.path.join(args.out, "checkpoint-{epoch}.h5")
if hvd.rank() == 0:
    os.makedirs(args.out, exist_ok=True)
    callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint))

history = model.fit(x_train, y_train, batch_size=32, callbacks=callbacks, epochs=args.epochs,
                    verbose=1 if hvd.rank() == 0 else 0)
for epoch, (lr, loss) in enumerate(zip(history.history["lr"], history.history["loss"])):
    print("rank {} epoch {}: lr {:.6f} loss {:.6f}".format(hvd.rank(), epoch, lr, loss), flush=True)
np.savez(os.path.join(args.out, "weights-{}.npz".format(hvd.rank())), *model.get_weights())
if hvd.rank() == 0:
    restored = hvd.load_model(checkpoint.format(epoch=args.epochs))
    print("restored {} ({})".format(type(restored.optimizer).__name__, type(restored.optimizer).__module__))
    np.testing.assert_allclose(restored.get_weights()[0], model.get_weights()[0])
print("rank {} of {}: done".format(hvd.rank(), hvd.size()), flush=True)
