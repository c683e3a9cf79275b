"""TF's "Distributed input" tutorial (TF 2.3-2.15), on local data: every way it feeds a strategy.

tensorflow/docs ``site/en/tutorials/distribute/input.ipynb`` as it writes its
program: a ``MirroredStrategy``; a batched dataset given to
``experimental_distribute_dataset`` and read with ``for x in dist_dataset``
through ``strategy.run`` in a ``tf.function``; the same with ``iter`` and
``next``; ``distribute_datasets_from_function`` whose function shards by its
``InputContext`` and batches by ``get_per_replica_batch_size``; the auto-shard
policies set through ``tf.data.Options``: ``FILE`` over TFRecord files, ``DATA``,
and ``OFF`` (every worker reads all of it).

A test's knobs, not the tutorial's: ``--out DIR`` for the TFRecord files (each task
writes its own copy, the same bytes) and ``ids-<task>.json``, the example ids each
way put on this task's replicas, step by step; ``--logical-cpus N`` mirrors over N
devices of one process's CPU.
"""

import argparse
import json
import os

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--logical-cpus", type=int, default=1)
args = p.parse_args()

if args.logical_cpus > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus)

task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"type": "local", "index": 0})
name = "{}-{}".format(task["type"], task["index"])
EXAMPLES = 64

# Four TFRecord files of 16 ids each (the tutorial's files on a shared file system; here each task's own copy).
data_dir = os.path.join(args.out, "data-" + name)
os.makedirs(data_dir, exist_ok=True)
files = []
for f in range(4):
    path = os.path.join(data_dir, "part-{}.tfrecord".format(f))
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(f * 16, f * 16 + 16):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))})).SerializeToString())
    files.append(path)

strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.logical_cpus)]
                                          if args.logical_cpus > 1 else None)
global_batch_size = 4 * strategy.num_replicas_in_sync


@tf.function
def train_step(inputs):
    return strategy.run(lambda x: tf.identity(x), args=(inputs,))


def ids_of(result):
    return sorted(int(i) for t in strategy.experimental_local_results(result) for i in t.numpy().ravel())


seen = {}

# tf.distribute.Strategy.experimental_distribute_dataset, read with a for loop
dataset = tf.data.Dataset.range(EXAMPLES).batch(global_batch_size)
dist_dataset = strategy.experimental_distribute_dataset(dataset)
seen["for"] = [ids_of(train_step(x)) for x in dist_dataset]

# ... and with iter and next
dist_iterator = iter(dist_dataset)
seen["next"] = [ids_of(train_step(next(dist_iterator))) for _ in range(EXAMPLES // global_batch_size)]


# tf.distribute.Strategy.distribute_datasets_from_function
def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    d = tf.data.Dataset.range(EXAMPLES)
    d = d.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    d = d.batch(batch_size)
    return d.prefetch(2)


dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)
seen["function"] = [ids_of(train_step(x)) for x in dist_dataset]


# The auto-shard policies, as tf.data.Options set them
def parse(record):
    return tf.io.parse_single_example(record, {"id": tf.io.FixedLenFeature([], tf.int64)})["id"]


for policy in ("FILE", "DATA", "OFF"):
    dataset = tf.data.Dataset.list_files(files, shuffle=False)
    dataset = dataset.interleave(tf.data.TFRecordDataset, cycle_length=1).map(parse).batch(global_batch_size)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, policy)
    dataset = dataset.with_options(options)
    seen[policy] = [ids_of(train_step(x)) for x in strategy.experimental_distribute_dataset(dataset)]

with open(os.path.join(args.out, "ids-{}.json".format(name)), "w") as f:
    json.dump(seen, f)
print("replicas {} read {}".format(strategy.num_replicas_in_sync, {k: len(v) for k, v in seen.items()}), flush=True)
