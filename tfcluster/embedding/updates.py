"""How a TF 1.x optimizer trains embedding variables: sparse, on the ps, one read and one write of each row.

``tf.compat.v1.train.Optimizer`` knows variables only. Two registered patches
(docs/patches.md) teach it embedding variables without changing what it does
for variables: ``compute_gradients`` also takes the gradient of the loss with
respect to the rows each lookup of an embedding variable in its ``var_list``
read (by that variable's stand-in, :mod:`.variable`), and ``apply_gradients``
adds, to the updates it passes to the optimizer's own ``_finish`` (so Adam's
beta powers move after them, as after any update), one update per part: on
that part's ps, the batch's ids summed once, their counts and last step
written, and each admitted id's row read, changed by the optimizer's own rule
and written back whole, and then the ids marked for the next incremental save.
Only the touched rows cross the wire, each way.

The rules are TF 1.x's sparse ones: GradientDescent, Adagrad, Ftrl (its
``l2_shrinkage`` and ``beta`` included) and Adam as LazyAdam (the moments of
rows a step touched; Adam's dense decay of every row would need every row).
Slots are kept as offsets from the optimizer's initial value, so a row starts
as zeros whatever the optimizer.
"""

from ..core import patches
from ..core.errors import SpecError
from .variable import of_graph, pack, tensorflow_v2, unpack

#: The attribute an optimizer carries its embedding gradients on, from compute_gradients to apply_gradients.
PENDING = "_tfcluster_embedding_gradients"


def _sgd(opt, w, s1, s2, g):
    return w - opt._learning_rate_tensor * g, s1, s2


def _adagrad(opt, w, s1, s2, g):
    init = opt._initial_accumulator_value
    accum = s1 + init + g * g
    return w - opt._learning_rate_tensor * g * tensorflow_v2().math.rsqrt(accum), accum - init, s2


def _ftrl(opt, w, s1, s2, g):
    tf = tensorflow_v2()
    lr, power = opt._learning_rate_tensor, opt._learning_rate_power_tensor
    l1 = opt._l1_regularization_strength_tensor
    l2 = getattr(opt, "_adjusted_l2_regularization_strength_tensor", None)
    l2 = l2 if l2 is not None else opt._l2_regularization_strength_tensor
    shrink = opt._l2_shrinkage_regularization_strength_tensor
    init = opt._initial_accumulator_value
    accum = s1 + init
    new_accum = accum + g * g
    linear = s2 + g + 2 * shrink * w - (tf.pow(new_accum, -power) - tf.pow(accum, -power)) / lr * w
    quadratic = tf.pow(new_accum, -power) / lr + 2 * l2
    w = tf.where(tf.abs(linear) > l1, (tf.sign(linear) * l1 - linear) / quadratic, tf.zeros_like(linear))
    return w, new_accum - init, linear


def _adam(opt, w, s1, s2, g):
    tf = tensorflow_v2()
    beta1_power, beta2_power = opt._get_beta_accumulators()
    b1, b2, eps = opt._beta1_t, opt._beta2_t, opt._epsilon_t
    lr = opt._lr_t * tf.sqrt(1 - beta2_power) / (1 - beta1_power)
    m = b1 * s1 + (1 - b1) * g
    v = b2 * s2 + (1 - b2) * g * g
    return w - lr * m / (tf.sqrt(v) + eps), m, v


def rule(optimizer, name: str):
    """The update rule of ``optimizer`` for embedding variable ``name``; one line for one that has none."""
    tf = tensorflow_v2()
    train = tf.compat.v1.train
    for kind, f in ((train.AdamOptimizer, _adam), (train.FtrlOptimizer, _ftrl), (train.AdagradOptimizer, _adagrad),
                    (train.GradientDescentOptimizer, _sgd)):
        if isinstance(optimizer, kind):
            return f
    raise SpecError(f"embedding variable {name}: {type(optimizer).__name__} cannot train it; GradientDescent, "
                    f"Adagrad, Ftrl, Adam and LazyAdam (tf.compat.v1.train) can")


def gradients(loss, var_list) -> list:
    """``[(variable, part, ids, counts, gradient)]`` for each lookup of an embedding variable in ``var_list``."""
    tf = tensorflow_v2()
    lookups = of_graph(loss.graph)["lookups"]
    chosen = {id(v) for v in (var_list if var_list is not None else tf.compat.v1.trainable_variables())}
    lookups = [entry for entry in lookups if id(entry[0].anchor) in chosen]
    if not lookups:
        return []
    grads = tf.gradients(loss, [rows for *_, rows in lookups])
    return [(v, part, ids, counts, g) for (v, part, ids, counts, _), g in zip(lookups, grads) if g is not None]


def part_updates(optimizer, pending: list, global_step) -> list:
    """One op per part looked up: its batch's ids counted and their rows trained (see the module doc)."""
    tf = tensorflow_v2()
    by_part = {}
    for v, part, ids, counts, g in pending:
        by_part.setdefault(id(part), (v, part, []))[2].append((ids, counts, g))
    ops = []
    # Rows record the step they were trained at, also where this optimizer is not the one that counts the steps
    # (wide & deep's second optimizer).
    global_step = global_step if global_step is not None else tf.compat.v1.train.get_global_step()
    for v, part, entries in by_part.values():
        update = rule(optimizer, v.name)
        with tf.device(part.device), tf.name_scope(f"update_{part.name.replace('/', '_')}"):
            if len(entries) == 1:       # one lookup: its ids are distinct already
                unique, counts, grad = entries[0][0], entries[0][1], tf.convert_to_tensor(entries[0][2])
            else:                       # several lookups of one variable in a step: one update of each id
                ids = tf.concat([e[0] for e in entries], 0)
                unique, at = tf.unique(ids, out_idx=tf.int32)
                n = tf.size(unique)
                counts = tf.math.unsorted_segment_sum(tf.concat([e[1] for e in entries], 0), at, n)
                grad = tf.math.unsorted_segment_sum(tf.concat([tf.convert_to_tensor(e[2]) for e in entries], 0),
                                                    at, n)
            ops.append(_train_part(optimizer, update, v, part, unique, counts, grad, global_step))
    return ops


def _train_part(optimizer, update, v, part, ids, counts, grad, global_step):
    """The op that counts ``ids`` (each seen ``counts`` times this step) and trains their rows on ``part``."""
    tf = tensorflow_v2()
    rows, present = part.find(ids)
    count, _ = unpack(rows)
    step = tf.fill(tf.shape(ids), tf.cast(global_step, tf.int64)) if global_step is not None \
        else tf.zeros(tf.shape(ids), tf.int64)
    d = v.dim
    w = part.weights(ids, rows, present)
    s1 = tf.where(present[:, None], rows[:, d:2 * d], tf.zeros_like(w))
    s2 = tf.where(present[:, None], rows[:, 2 * d:3 * d], tf.zeros_like(w))
    w, s1, s2 = update(optimizer, w, s1, s2, grad)
    ops = []
    if part.unadmitted is None:
        seen = tf.where(present, count, 0) + counts
        admitted = tf.ones_like(present)
    else:
        seen = tf.where(present, count, part.counts(ids)[:, 0]) + counts
        admitted = tf.logical_or(present, seen >= v.filter_freq)
        waiting = tf.logical_not(admitted)
        # An admitted id's waiting count stays behind (its row is read first) until the next save drops it: a
        # removal would leave TF's table a deleted bucket in lookups' way (Part.rebuild).
        ops.append(tf.raw_ops.LookupTableInsertV2(table_handle=part.unadmitted, keys=tf.boolean_mask(ids, waiting),
                                                  values=tf.boolean_mask(tf.stack([seen, step], 1), waiting)))
    new_rows = tf.concat([w, s1, s2, pack(seen, step)], 1)
    ops.append(tf.raw_ops.LookupTableInsertV2(table_handle=part.values, keys=tf.boolean_mask(ids, admitted),
                                              values=tf.boolean_mask(new_rows, admitted)))
    with tf.control_dependencies(ops):      # marked after the writes, for the next incremental save (.increments)
        return part.mark(ids)


def _computing(compute):
    def compute_gradients(self, loss, var_list=None, *args, **kwargs):
        pairs = compute(self, loss, var_list, *args, **kwargs)
        tf = tensorflow_v2()
        if callable(loss) or not isinstance(loss, tf.Tensor) or not of_graph(loss.graph)["lookups"]:
            return pairs
        pending = gradients(loss, var_list)
        if not pending:
            return pairs
        setattr(self, PENDING, getattr(self, PENDING, []) + pending)
        # The stand-in's gradient is zero-size, not None: minimize and apply_gradients then take a model of
        # embedding variables alone, and the update below rides on the optimizer's own.
        trained = {id(v.anchor) for v, *_ in pending}
        return [(tf.zeros([0], v.dtype.base_dtype) if g is None and id(v) in trained else g, v) for g, v in pairs]
    return compute_gradients


def _applying(apply):
    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        pending = self.__dict__.pop(PENDING, None)
        if not pending:
            return apply(self, grads_and_vars, global_step, name)
        finish = self._finish

        def finish_with_rows(update_ops, scope):
            return finish(list(update_ops) + part_updates(self, pending, global_step), scope)
        self._finish = finish_with_rows        # this call's only: put back below
        try:
            return apply(self, grads_and_vars, global_step, name)
        finally:
            del self._finish
    return apply_gradients


_WHO = "the first embedding variable a graph makes"
patches.register(patches.Patch(
    "embedding.gradients", "tensorflow.python.training.optimizer:Optimizer.compute_gradients",
    "a TF 1.x optimizer also differentiates the loss by the rows its embedding variables' lookups read",
    _computing, _WHO, params=("self", "loss", "var_list")))
patches.register(patches.Patch(
    "embedding.updates", "tensorflow.python.training.optimizer:Optimizer.apply_gradients",
    "a TF 1.x optimizer's update also trains the rows of its embedding variables, on their ps",
    _applying, _WHO, params=("self", "grads_and_vars", "global_step", "name")))


def install():
    """Teach TF 1.x optimizers embedding variables (once per process)."""
    patches.install("embedding.gradients")
    patches.install("embedding.updates")
