"""TF's "Save and load a model using a distribution strategy" tutorial (TF 2.2-2.15), on local data.

tensorflow/docs ``site/en/tutorials/distribute/save_and_load.ipynb`` as it writes
its program: a model built and trained in a ``MirroredStrategy``'s scope; saved
with Keras's ``model.save`` and loaded back with no strategy (and trained on),
and in a ``OneDeviceStrategy``'s scope (and trained on); exported with
``tf.saved_model.save`` and loaded with ``tf.saved_model.load``, its serving
signature called without a strategy and in another ``MirroredStrategy``'s
``run`` over a distributed dataset; then saved and loaded with
``experimental_io_device="/job:localhost"`` (the guide's way to save from a
cluster to the local file system).

A test's knobs, not the tutorial's: ``--out DIR`` for the tutorial's ``/tmp``
paths and ``predictions-<task>.npz`` (each loaded model on the evaluation images);
``--logical-cpus N`` mirrors over N devices of one process's CPU; ``--same-batches``
seeds the initial values and leaves out the shuffle.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--logical-cpus", type=int, default=1)
p.add_argument("--same-batches", action="store_true")
args = p.parse_args()

if args.logical_cpus > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus)

devices = [f"/cpu:{i}" for i in range(args.logical_cpus)] if args.logical_cpus > 1 else None
mirrored_strategy = tf.distribute.MirroredStrategy(devices)

rng = np.random.RandomState(0)       # the tutorial's tfds.load("mnist"), replaced by local data
images = rng.randint(0, 256, (384, 28, 28, 1)).astype("uint8")
labels = (images[:, :14].mean(axis=(1, 2, 3)) > images[:, 14:].mean(axis=(1, 2, 3))).astype("int64")


def get_data():
    mnist_train = tf.data.Dataset.from_tensor_slices((images[:256], labels[:256]))
    mnist_test = tf.data.Dataset.from_tensor_slices((images[256:], labels[256:]))
    BUFFER_SIZE = 10000
    BATCH_SIZE_PER_REPLICA = 16
    BATCH_SIZE = BATCH_SIZE_PER_REPLICA * mirrored_strategy.num_replicas_in_sync

    def scale(image, label):
        image = tf.cast(image, tf.float32)
        image /= 255
        return image, label

    train_dataset = mnist_train.map(scale).cache()
    if not args.same_batches:
        train_dataset = train_dataset.shuffle(BUFFER_SIZE)
    train_dataset = train_dataset.batch(BATCH_SIZE)
    eval_dataset = mnist_test.map(scale).batch(BATCH_SIZE)
    return train_dataset, eval_dataset


def init(seed):
    return tf.keras.initializers.GlorotUniform(seed) if args.same_batches else "glorot_uniform"


def get_model():
    with mirrored_strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.layers.Conv2D(8, 3, activation="relu", input_shape=(28, 28, 1), kernel_initializer=init(1)),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(16, activation="relu", kernel_initializer=init(2)),
            tf.keras.layers.Dense(10, kernel_initializer=init(3)),
        ])
        model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=tf.keras.optimizers.Adam(), metrics=[tf.metrics.SparseCategoricalAccuracy()])
        return model


model = get_model()
train_dataset, eval_dataset = get_data()
model.fit(train_dataset, epochs=2, verbose=2)
predictions = {"trained": model.predict(images[256:] / 255.0, verbose=0)}

# The Keras API
keras_model_path = os.path.join(args.out, "keras_save")
model.save(keras_model_path)
restored_keras_model = tf.keras.models.load_model(keras_model_path)
predictions["keras_loaded"] = restored_keras_model.predict(images[256:] / 255.0, verbose=0)
restored_keras_model.fit(train_dataset, epochs=2, verbose=2)

another_strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
with another_strategy.scope():
    restored_keras_model_ds = tf.keras.models.load_model(keras_model_path)
    restored_keras_model_ds.fit(train_dataset, epochs=2, verbose=2)

# The tf.saved_model API
model = get_model()      # get a fresh model
saved_model_path = os.path.join(args.out, "tf_save")
tf.saved_model.save(model, saved_model_path)

DEFAULT_FUNCTION_KEY = "serving_default"
loaded = tf.saved_model.load(saved_model_path)
inference_func = loaded.signatures[DEFAULT_FUNCTION_KEY]
predict_dataset = eval_dataset.map(lambda image, label: image)
for batch in predict_dataset.take(1):
    print("inference", list(inference_func(batch).values())[0].shape, flush=True)

another_strategy = tf.distribute.MirroredStrategy(devices)
with another_strategy.scope():
    loaded = tf.saved_model.load(saved_model_path)
    inference_func = loaded.signatures[DEFAULT_FUNCTION_KEY]
    dist_predict_dataset = another_strategy.experimental_distribute_dataset(predict_dataset)
    for batch in dist_predict_dataset:
        result = another_strategy.run(inference_func, args=(batch,))
        print("distributed inference", len(another_strategy.experimental_local_results(result)), flush=True)
        break

# Saving and loading from a local device
model = get_model()
save_options = tf.saved_model.SaveOptions(experimental_io_device="/job:localhost")
model.save(saved_model_path, options=save_options)
with another_strategy.scope():
    load_options = tf.saved_model.LoadOptions(experimental_io_device="/job:localhost")
    loaded = tf.keras.models.load_model(saved_model_path, options=load_options)
predictions["io_device"] = loaded.predict(images[256:] / 255.0, verbose=0)
predictions["io_device_fresh"] = model.predict(images[256:] / 255.0, verbose=0)

task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"type": "local", "index": 0})
np.savez(os.path.join(args.out, "predictions-{}-{}.npz".format(task["type"], task["index"])), **predictions)
print("saved and loaded", flush=True)
