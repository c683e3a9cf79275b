"""A tf-keras train step as the training session runs steps: Keras's feeds and outputs, tfcluster's step.

tf-keras's loop calls its model's ``train_function`` once per batch with the
batch's inputs: numpy arrays for the model's placeholders, or a dataset
iterator's tensors to connect to them (``GraphExecutionFunction``). During a
cluster fit that function is :class:`SharedTrainFunction`: it hands the
inputs to :class:`KerasStep` and runs one step of the
:class:`~tfcluster.training.loop.TrainingLoop`, so every batch goes through
the training session (false duplicates rerun, a lost task recovered, the step
timeout) with the hooks around it (checkpoints, the chief's heartbeat), then
returns the loss and metrics tf-keras's progress bar and callbacks expect.

Every run here is an ordinary ``Session.run`` with RunOptions: a callable made
from CallableOptions (what tf-keras uses, for its tensor connections) ignores
their timeout on a gRPC session (``GrpcSession::RunCallable`` applies only the
config's ``operation_timeout_in_ms``), so a silent ps would hold it for ever.
A dataset's batch is read first, on this worker, then fed.
"""

import math

from ..graph.step import StepResult, StepRunner, global_step_after
from ..runtime.preemption import StepInterrupted


def run_like_callable(session, callable_options, args, options=None, run_metadata=None):
    """What a callable made from ``callable_options`` returns for ``args``, as ordinary runs with ``options``."""
    graph = session.graph
    feeds = {graph.as_graph_element(name): value for name, value in zip(callable_options.feed, args)}
    links = list(callable_options.tensor_connection)
    if links:       # each connected tensor's value first (a dataset's batch), then fed to its placeholder
        values = session.run([link.from_tensor for link in links], options=options)
        feeds.update({graph.as_graph_element(link.to_tensor): v for link, v in zip(links, values)})
    fetches = list(callable_options.fetch)
    out = session.run([fetches, list(callable_options.target)], feed_dict=feeds, options=options,
                      run_metadata=run_metadata)
    return out[0]


class KerasStep(StepRunner):
    """Runs a tf-keras train function's step: its updates, then the global step; its outputs kept in ``outputs``."""

    def __init__(self, function, global_step, after=()):
        # ``after``: ops of the step that run once its updates ran (the all-reduce's averaged model state).
        super().__init__(global_step_after([function.updates_op, *after], global_step), function.outputs[0])
        self.function = function
        self.outputs = None        # the last step's loss and metrics, as tf-keras's loop takes them
        self._feeds = ([], [], [])
        self._callables = {}

    def attach(self, session, step_timeout_secs=None):
        """Bind to ``session`` (a new one after each recovery): callables are made again on it."""
        import tensorflow as tf
        self._session = session
        self.step_options = tf.compat.v1.RunOptions(timeout_in_ms=int(step_timeout_secs * 1000)) \
            if step_timeout_secs else None
        self._callables = {}

    def feed(self, inputs):
        """Take what tf-keras's loop passes for the next step, as ``GraphExecutionFunction`` takes it."""
        import numpy as np
        import tensorflow as tf
        fed, values, connected = [], [], []
        for tensor, value in zip(self.function.inputs, tf.nest.flatten(inputs, expand_composites=True)):
            if value is None:
                continue
            if tf.is_tensor(value):        # a dataset's next element: read it, then feed it
                connected.append((tensor, value))
            else:
                fed.append(tensor)
                values.append(np.asarray(value, dtype=tensor.dtype.as_numpy_dtype))
        extra = self.function.feed_dict or {}
        for key in sorted(extra, key=lambda t: t.name):
            fed.append(key)
            values.append(np.asarray(extra[key], dtype=key.dtype.as_numpy_dtype))
        self._feeds = (fed, values, connected)

    def step(self, request=None) -> StepResult:
        """One step with the fed inputs; hooks' ``request`` fetched and fed along, as for every runner."""
        import numpy as np
        import tensorflow as tf
        fed, values, connected = self._feeds
        function = self.function
        options = request.options if request is not None and request.options is not None else self.step_options
        if connected:
            batch = self._session.run([t for _, t in connected], options=self.step_options)
            fed = fed + [p for p, _ in connected]
            values = values + [np.asarray(v, dtype=p.dtype.as_numpy_dtype) for (p, _), v in zip(connected, batch)]
        hook_feeds = dict(request.feed_dict or {}) if request is not None else {}
        fetches = [self.train_fetch, function.outputs, function.fetches]
        if request is not None and request.fetches is not None:
            fetches.append(request.fetches)
        key = (tuple(t.name for t in fed + list(hook_feeds)),
               tuple(getattr(f, "name", str(f)) for f in tf.nest.flatten(fetches)))
        call = self._callables.get(key)
        if call is None:
            call = self._callables[key] = self._session.make_callable(fetches, feed_list=fed + list(hook_feeds),
                                                                      accept_options=True)
        meta = tf.compat.v1.RunMetadata() if request is not None and request.options is not None else None
        got = call(*values, *hook_feeds.values(), options=options, run_metadata=meta)
        self.outputs = list(got[1])
        for fetch, value in zip(function.fetches, got[2]):
            if fetch in function.fetch_callbacks:    # a tf-keras callback's own fetch (TensorBoard's)
                function.fetch_callbacks[fetch](value)
        return StepResult(int(got[0]), float(self.outputs[0]), got[3] if len(got) > 3 else None, meta)


class SharedTrainFunction:
    """What tf-keras's loop calls for each batch during a cluster fit: one step of the training loop.

    Everything else tf-keras reads of its train function (``inputs``,
    ``outputs``, ``fetches``, ``fetch_callbacks``...) is the original's.
    """

    def __init__(self, function, step: KerasStep, loop):
        self.function, self.step, self.loop = function, step, loop

    def __call__(self, inputs):
        self.step.feed(inputs)
        try:
            self.loop.step()
        except StepInterrupted:      # a sync wait given up for a SIGTERM: the loop stops after this batch
            if self.step.outputs is None:
                self.step.outputs = [math.nan] * len(self.function.outputs)
        return list(self.step.outputs)

    def __getattr__(self, name):
        return getattr(self.function, name)
