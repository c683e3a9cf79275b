"""What a trainer's graph is made of, whatever the strategy.

- :mod:`.model`: the model contract (``model_fn``, ``input_fn``) and the loss scaled to the global batch;
- :mod:`.placement`: byte-balanced ps placement, partitioning, the placement report;
- :mod:`.crossing`: tensors that cross between two devices in a step travel packed, one transfer for them all;
- :mod:`.gate`: a trainer's step reads its input only once every ps took the step, so a step TF falsely
  rejects is rerun on what it would have read (and what a *source* of a step is);
- :mod:`.prefetch`: the next step's rows fetched during this step (a batch's lookups staged one step ahead);
- :mod:`.precision`: bfloat16 math where the CPU has it (oneDNN's automatic mixed precision);
- :mod:`.wire`: the 16-bit wire: weights and gradients cross in bfloat16, the ps keeps float32;
- :mod:`.repartition`: a checkpoint's tables restored by id into another part count ("mod" lookups too);
- :mod:`.inplace_reads`: a save reads each sparsely updated variable in place, not a copy of it;
- :mod:`.lazy_adam`: TF 1.x's LazyAdamOptimizer (tf.contrib.opt), Adam updating only touched rows;
- :mod:`.sparse`: tables on the ps looked up one distinct id at a time, so each touched row crosses once;
- :mod:`.sparse_updates`: sparse updates of those distinct ids: no second deduplication, every row of a step at once;
- :mod:`.step`: the step contract: the TrainGraph a front end builds, the StepRunner the session runs,
  and the Hook interface the loop calls around each step;
- :mod:`.traffic`: the bytes a traced step moved between tasks (a hook that measures them).
"""
