"""TF 1.x's ``tf.contrib.opt.LazyAdamOptimizer``: Adam that updates only the rows a sparse gradient touches.

``tf.compat.v1.train.AdamOptimizer`` decays both moments of every row of a
table at every step (``m *= beta1`` over the whole slot, on the ps), so a step
costs the table's size there and rows no batch used still move. TF 1.x's
contrib variant, removed with contrib in TF 2.0, reads, updates and writes
back only the touched rows of ``m``, ``v`` and the variable, with Adam's
bias-corrected learning rate; dense gradients get Adam's own update. TF1 mode
serves it as ``tf.contrib.opt.LazyAdamOptimizer`` (docs/embeddings.md).

TensorFlow is imported when the class is first used.
"""

_CLASS = None


def _lazy_adam_class():
    import tensorflow as tf
    tf1 = tf.compat.v1

    class LazyAdamOptimizer(tf1.train.AdamOptimizer):
        """Adam whose sparse updates touch only the gradient's rows (TF 1.x's tf.contrib.opt.LazyAdamOptimizer)."""

        def _lazy_update(self, values, var, indices):
            dtype = var.dtype.base_dtype
            beta1_power, beta2_power = (tf.cast(p, dtype) for p in self._get_beta_accumulators())
            lr, beta1, beta2, epsilon = (tf.cast(t, dtype) for t in (self._lr_t, self._beta1_t, self._beta2_t,
                                                                     self._epsilon_t))
            lr = lr * tf.sqrt(1 - beta2_power) / (1 - beta1_power)
            m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
            # The gradient arrives with each index once (apply_gradients adds duplicates up first).
            m_rows = beta1 * tf.gather(m, indices) + (1 - beta1) * values
            v_rows = beta2 * tf.gather(v, indices) + (1 - beta2) * tf.square(values)
            return tf.group(self._scatter("update", m, indices, m_rows),
                            self._scatter("update", v, indices, v_rows),
                            self._scatter("sub", var, indices, lr * m_rows / (tf.sqrt(v_rows) + epsilon)))

        def _scatter(self, kind, var, indices, rows):
            """The op writing ``rows`` into ``var`` (``kind``: update or sub), of a resource or reference variable."""
            if hasattr(var, "handle"):
                from tensorflow.python.ops import gen_resource_variable_ops
                return getattr(gen_resource_variable_ops, f"resource_scatter_{kind}")(var.handle, indices, rows)
            return getattr(tf1, f"scatter_{kind}")(var, indices, rows, use_locking=self._use_locking).op

        def _apply_sparse(self, grad, var):
            return self._lazy_update(grad.values, var, grad.indices)

        def _resource_apply_sparse(self, grad, var, indices):
            return self._lazy_update(grad, var, indices)

    return LazyAdamOptimizer


def lazy_adam_optimizer():
    """The LazyAdamOptimizer class (made once per process, on first use)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _lazy_adam_class()
    return _CLASS
