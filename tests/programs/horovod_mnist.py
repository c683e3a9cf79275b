"""Horovod's examples/tensorflow/tensorflow_mnist.py as Horovod 0.28 writes it (TF 1.x graph), on local data.

``hvd.init()``, a GPU pinned by ``visible_device_list = str(hvd.local_rank())``,
``hvd.DistributedOptimizer`` around a ``tf.train`` optimizer,
``hvd.BroadcastGlobalVariablesHook(0)``, ``StopAtStepHook``, checkpoints on rank
0 alone, and a ``MonitoredTrainingSession`` without a target. Its data are
generated (no download); each rank steps on its own part of a global batch
(``--global-batch`` rows, rank r the r-th slice), and the learning rate is not
scaled by the size, so one process on the global batch takes the same steps.
``--out DIR`` gets ``weights-<rank>.npz``; each rank says the global step it
starts at, every ``--print-every`` steps, and its thread count after the first
step and at the end; ``--save-steps`` sets rank 0's checkpoint interval;
``--trace`` traces the last step and says the bytes its all-reduces carried. ``--passes``, ``--predivide``,
``--fp16`` and ``--op sum`` give ``DistributedOptimizer`` Horovod's ``backward_passes_per_step``,
``gradient_predivide_factor``, ``Compression.fp16`` and ``op=hvd.Sum``; ``--collectives`` first
checks allgather, alltoall, a prescaled allreduce, grouped_allreduce,
reducescatter, broadcast_object and allgather_object against what Horovod
documents.
"""

import argparse
import os

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--global-batch", type=int, default=32)
p.add_argument("--passes", type=int, default=1)
p.add_argument("--predivide", type=float, default=1.0)
p.add_argument("--fp16", action="store_true")
p.add_argument("--op", choices=("average", "sum"), default="average")
p.add_argument("--lr", type=float, default=0.1)
p.add_argument("--collectives", action="store_true")
p.add_argument("--save-steps", type=int, default=None, help="rank 0's checkpoint every N steps")
p.add_argument("--print-every", type=int, default=0, help="say each N-th step")
p.add_argument("--trace", action="store_true", help="trace the last step; say the bytes its all-reduce carried")
args = p.parse_args()

hvd.init()
if args.collectives:
    r, n = hvd.rank(), hvd.size()
    gathered = hvd.allgather(tf.fill([r + 1, 2], float(r)))          # rank r sends r + 1 rows
    rows = tf.constant([[10.0 * r + j] for j in range(n) for _ in range(j + 1)])
    received, counts = hvd.alltoall(rows, splits=[j + 1 for j in range(n)])     # j + 1 rows to rank j
    total = hvd.allreduce(tf.constant(float(r + 1)), op=hvd.Sum, prescale_factor=2.0)
    grouped = hvd.grouped_allreduce([tf.constant(float(r)), tf.constant([1.0, float(r)])], op=hvd.Sum)
    scattered = hvd.reducescatter(tf.reshape(tf.range(6.0), [3, 2]) + float(r), op=hvd.Sum)   # 3 rows over n
    with tf.Session() as session:
        g, out, c, t, gr, sc = session.run([gathered, received, counts, total, grouped, scattered])
    assert g.tolist() == [[float(i)] * 2 for i in range(n) for _ in range(i + 1)], g
    assert out.ravel().tolist() == [10.0 * i + r for i in range(n) for _ in range(r + 1)], out
    assert c.tolist() == [r + 1] * n and t == n * (n + 1), (c, t)
    ranks_sum = n * (n - 1) / 2
    assert gr[0] == ranks_sum and gr[1].tolist() == [n, ranks_sum], gr
    mine = [i for i in range(3) if i * n // 3 == r] if n == 3 else ([0, 1] if r == 0 else [2])
    assert sc.tolist() == [[n * (2.0 * i) + ranks_sum, n * (2.0 * i + 1) + ranks_sum] for i in mine], sc
    assert hvd.broadcast_object({"epoch": 7} if r == 0 else None, root_rank=0) == {"epoch": 7}
    assert hvd.allgather_object(("rank", r)) == [("rank", i) for i in range(n)]
    print("rank {}: collectives agree".format(r), flush=True)
rng = np.random.RandomState(0)
x_all = rng.rand(2048, 64).astype("float32")
y_all = (x_all.sum(axis=1) > 32).astype("int64")
batch = args.global_batch // hvd.size()

image = tf.placeholder(tf.float32, [None, 64])
label = tf.placeholder(tf.int64, [None])
hidden = tf.layers.dense(image, 32, activation=tf.nn.relu, kernel_initializer=tf.glorot_uniform_initializer(seed=1))
logits = tf.layers.dense(hidden, 2, kernel_initializer=tf.glorot_uniform_initializer(seed=2))
loss = tf.losses.sparse_softmax_cross_entropy(label, logits)

global_step = tf.train.get_or_create_global_step()
opt = hvd.DistributedOptimizer(tf.train.GradientDescentOptimizer(args.lr), backward_passes_per_step=args.passes,
                               op=hvd.Sum if args.op == "sum" else hvd.Average,
                               gradient_predivide_factor=args.predivide,
                               compression=hvd.Compression.fp16 if args.fp16 else hvd.Compression.none)
train_op = opt.minimize(loss, global_step=global_step)

final = tf.train.FinalOpsHook(tf.trainable_variables())      # the weights at the end, for the test


class SayStart(tf.train.SessionRunHook):
    """Say the global step each session starts at (after the broadcast: rank 0's restored one)."""

    def after_create_session(self, session, coord):
        print("rank {} starts at global step {}".format(hvd.rank(), session.run(global_step)), flush=True)


hooks = [hvd.BroadcastGlobalVariablesHook(0), tf.train.StopAtStepHook(last_step=args.steps), final, SayStart()]
checkpoint_dir = os.path.join(args.out, "checkpoints") if hvd.rank() == 0 else None
config = tf.ConfigProto()
config.gpu_options.allow_growth = True
config.gpu_options.visible_device_list = str(hvd.local_rank())

step = 0
with tf.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, hooks=hooks, config=config,
                                       save_checkpoint_steps=args.save_steps) as mon_sess:
    while not mon_sess.should_stop():
        lo = (step * args.global_batch) % len(x_all) + hvd.rank() * batch
        traced = args.trace and step == args.steps - 1
        options = tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE) if traced else None
        metadata = tf.RunMetadata() if traced else None
        mon_sess.run(train_op, feed_dict={image: x_all[lo:lo + batch], label: y_all[lo:lo + batch]},
                     options=options, run_metadata=metadata)
        if traced:      # what each all-reduce carried: its output is as big as what this rank put in
            carried = [o.tensor_description for d in metadata.step_stats.dev_stats for n in d.node_stats
                       if n.node_name.endswith("CollectiveReduceV2") for o in n.output]
            sizes = [(tf.as_dtype(t.dtype).name,
                      int(np.prod([d.size for d in t.shape.dim])) * tf.as_dtype(t.dtype).size) for t in carried]
            print("rank {} all-reduced {} bytes in a step ({})".format(
                hvd.rank(), sum(b for _, b in sizes), ", ".join(sorted(n for n, _ in sizes))), flush=True)
        step += 1
        if step == 1:
            threads = len(os.listdir("/proc/self/task"))
        if args.print_every and step % args.print_every == 0:
            print("rank {} step {}".format(hvd.rank(), step), flush=True)
weights = final.final_ops_values
os.makedirs(args.out, exist_ok=True)
np.savez(os.path.join(args.out, "weights-{}.npz".format(hvd.rank())), *weights)
print("rank {} of {} (local rank {}, host {} of {}): {} steps".format(hvd.rank(), hvd.size(), hvd.local_rank(),
                                                                    hvd.cross_rank(), hvd.cross_size(), step),
      flush=True)
print("rank {}: {} threads after the first step, {} at the end".format(
    hvd.rank(), threads, len(os.listdir("/proc/self/task"))), flush=True)
assert isinstance(hooks[0], hvd.BroadcastGlobalVariablesHook) and isinstance(hooks[0], tf.train.SessionRunHook)
