"""The session tf-keras's backend sees during a cluster fit: always the training session's current one.

tf-keras runs more than the train step on its default session: metric resets,
callbacks' reads, the validation step, ``save_weights``. After a lost ps or
worker, the training session recreates its ``tf.compat.v1.Session``
(:mod:`tfcluster.training.session`); a plain session pushed as the default
would then be a closed one. :class:`CurrentSession` is pushed instead: each
run goes to the current session, bounded by the step timeout, with the
training session's recovery, and so does each call of a callable tf-keras
makes.
"""

from .step import run_like_callable


class CurrentSession:
    """Stands for ``training.session`` (a :class:`~tfcluster.training.session.TrainingSession`) wherever tf-keras
    asks for its default session."""

    def __init__(self, training):
        self._training = training

    @property
    def graph(self):
        """The training graph."""
        return self._training.graph

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        """``Session.run`` on the current session (bounded by the step timeout), recovering a lost one."""
        options = options if options is not None else self._training.step_options
        return self._training.call(lambda s: s.run(fetches, feed_dict=feed_dict, options=options,
                                                   run_metadata=run_metadata))

    def _make_callable_from_options(self, callable_options):
        # The name tf-keras calls (GraphExecutionFunction): a callable that follows the current session and
        # whose runs are bounded (a gRPC session's callables ignore their own RunOptions: step.py).
        return _Following(self._training, callable_options)

    def as_default(self):
        """Make this the default session in a ``with`` block (what tf-keras's backend then uses)."""
        from tensorflow.python.framework import stack     # TF's own: "any object with Session.run()"
        return stack.default_session(self)

    def __getattr__(self, name):
        return getattr(self._training.session, name)


class _Following:
    """A callable of CallableOptions, run as ordinary runs on the training session's current session."""

    def __init__(self, training, callable_options):
        self._training, self._options = training, callable_options

    def __call__(self, *args, run_metadata=None):
        options = self._training.step_options
        return self._training.call(lambda s: run_like_callable(s, self._options, args, options, run_metadata))
