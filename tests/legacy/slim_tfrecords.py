"""slim's image-classification input and nets, unchanged: TFRecords through a DatasetDataProvider into resnet_v1.

The input half of slim's train_image_classifier.py / eval_image_classifier.py:
a slim Dataset over TFRecord files of PNG images (tfexample_decoder),
parallel readers and a prefetch queue, a net from slim.nets in its arg_scope,
slim.learning.train for a few steps, then slim.evaluation.evaluate_once with
streaming metrics. Do not modernise: it is the unchanged TF 1.x code that
tfcluster's TF1 mode must run.
"""
import tensorflow as tf
from tensorflow.contrib.slim.nets import resnet_v1

slim = tf.contrib.slim

flags = tf.app.flags
flags.DEFINE_string("dataset_dir", "", "The TFRecord file")
flags.DEFINE_integer("num_samples", 20, "Examples in it")
flags.DEFINE_string("train_dir", "/tmp/slim_tfrecords", "Checkpoints")
flags.DEFINE_integer("max_number_of_steps", 3, "Steps to train")
FLAGS = flags.FLAGS
NUM_CLASSES = 10


def get_dataset():
    keys_to_features = {
        "image/encoded": tf.FixedLenFeature((), tf.string, default_value=""),
        "image/format": tf.FixedLenFeature((), tf.string, default_value="png"),
        "image/class/label": tf.FixedLenFeature([], tf.int64, default_value=0),
    }
    items_to_handlers = {
        "image": slim.tfexample_decoder.Image(shape=[32, 32, 3]),
        "label": slim.tfexample_decoder.Tensor("image/class/label"),
    }
    decoder = slim.tfexample_decoder.TFExampleDecoder(keys_to_features, items_to_handlers)
    return slim.dataset.Dataset(data_sources=FLAGS.dataset_dir, reader=tf.TFRecordReader, decoder=decoder,
                                num_samples=FLAGS.num_samples, items_to_descriptions={}, num_classes=NUM_CLASSES)


def network(images, is_training):
    with slim.arg_scope(resnet_v1.resnet_arg_scope()):
        logits, end_points = resnet_v1.resnet_v1_50(images, num_classes=NUM_CLASSES, is_training=is_training)
    return tf.squeeze(logits, [1, 2])


def train():
    provider = slim.dataset_data_provider.DatasetDataProvider(get_dataset(), num_readers=2,
                                                              common_queue_capacity=40, common_queue_min=10)
    image, label = provider.get(["image", "label"])
    images, labels = tf.train.batch([tf.to_float(image) / 255., label], batch_size=4, num_threads=1, capacity=20)
    images, labels = slim.prefetch_queue.prefetch_queue([images, labels], capacity=4).dequeue()
    logits = network(images, is_training=True)
    tf.losses.softmax_cross_entropy(slim.one_hot_encoding(labels, NUM_CLASSES), logits)
    optimizer = tf.train.MomentumOptimizer(0.01, 0.9)
    train_op = slim.learning.create_train_op(tf.losses.get_total_loss(), optimizer, clip_gradient_norm=5.0)
    return slim.learning.train(train_op, FLAGS.train_dir, number_of_steps=FLAGS.max_number_of_steps,
                               save_summaries_secs=600)


def evaluate():
    provider = slim.dataset_data_provider.DatasetDataProvider(get_dataset(), shuffle=False)
    image, label = provider.get(["image", "label"])
    images, labels = tf.train.batch([tf.to_float(image) / 255., label], batch_size=4)
    logits = network(images, is_training=False)
    names_to_values, names_to_updates = slim.metrics.aggregate_metric_map({
        "accuracy": slim.metrics.streaming_accuracy(tf.argmax(logits, 1), labels),
        "recall_5": slim.metrics.streaming_sparse_recall_at_k(logits, tf.reshape(labels, [-1, 1]), 5),
    })
    return slim.evaluation.evaluate_once("", tf.train.latest_checkpoint(FLAGS.train_dir), FLAGS.train_dir + "/eval",
                                         num_evals=2, eval_op=list(names_to_updates.values()),
                                         final_op=list(names_to_values.values()))


def main(_):
    with tf.Graph().as_default():
        loss = train()
    print("trained %d steps, final loss %.4f" % (FLAGS.max_number_of_steps, loss))
    with tf.Graph().as_default():
        accuracy, recall_5 = evaluate()
    print("evaluated: accuracy %.4f recall@5 %.4f" % (accuracy, recall_5))


if __name__ == "__main__":
    tf.app.run()
