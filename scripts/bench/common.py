"""What every bench workload shares: the model, the in-memory data, the result line and the peers' cluster plumbing."""

import json
import os
import time

import numpy as np

INPUT, HIDDEN, CLASSES = 784, 512, 10

#: The bench's MLPs: hidden layers and the per-worker batch. ``mlp``: 784-512-10, 0.4M parameters
#: (1.6 MB), the rows P1-P7 compare. ``big``: 784-2048-2048-10, 5.8M parameters (23 MB), where moving
#: the weights and gradients costs more than computing with them.
MODELS = {"mlp": ((HIDDEN,), 128), "big": ((2048, 2048), 64)}


def synthetic(n=8192, seed=0):
    """In-memory MNIST-shaped data, so input is never the bottleneck."""
    rng = np.random.RandomState(seed)
    x = rng.rand(n, INPUT).astype(np.float32)
    y = rng.randint(0, CLASSES, n).astype(np.int32)
    return x, y


def mlp_logits(tf1, x, hidden=(HIDDEN,)):
    """The shared workload: an MLP 784-512-10 by default (variables created with get_variable)."""
    init = tf1.glorot_uniform_initializer(seed=1)
    h, width = x, INPUT
    for i, units in enumerate(hidden, start=1):
        w = tf1.get_variable(f"w{i}", [width, units], initializer=init)
        b = tf1.get_variable(f"b{i}", [units], initializer=tf1.zeros_initializer())
        h, width = tf1.nn.relu(tf1.matmul(h, w) + b), units
    w = tf1.get_variable(f"w{len(hidden) + 1}", [width, CLASSES], initializer=init)
    b = tf1.get_variable(f"b{len(hidden) + 1}", [CLASSES], initializer=tf1.zeros_initializer())
    return tf1.matmul(h, w) + b


class Meter:
    """Counts examples per second over a worker's steps, and its first and last step times."""

    # Measured as tfcluster.fit measures itself: every step from the first to
    # the last, so neither side gets a warm-up the other does not.
    def __init__(self, batch):
        self.batch = batch
        self.steps = 0
        self.first_step_at = None
        self.last_step_at = None
        self._t0 = None
        self.timeline, self._next_mark = [], 0.0

    def step(self):
        now = time.time()
        if self._t0 is None:
            self._t0 = now
        if self.first_step_at is None:
            self.first_step_at = now
        self.steps += 1
        self.last_step_at = now
        if now >= self._next_mark:
            self.timeline.append((now, self.steps))
            self._next_mark = now + 0.5

    def result(self, **extra):
        elapsed = (self.last_step_at or 0) - (self._t0 or 0)
        eps = self.steps * self.batch / elapsed if elapsed > 0 else 0.0
        return dict(examples_per_sec=eps, steps=self.steps, first_step_at=self.first_step_at,
                    last_step_at=self.last_step_at, timeline=self.timeline + [(self.last_step_at, self.steps)],
                    batch=self.batch, **extra)


def report(result):
    """Print the one line the bench driver parses."""
    print("BENCH " + json.dumps(result), flush=True)


def four_flags(parser):
    """The classic TF1 cluster flags (``--job_name --task_index --ps_hosts --worker_hosts``) on ``parser``."""
    for flag in ("--job_name", "--ps_hosts", "--worker_hosts"):
        parser.add_argument(flag)
    parser.add_argument("--task_index", type=int)
    return parser


def pss_role(tf):
    """TF_CONFIG's resolver on the chief; a worker or ps serves here until it is killed (it never returns)."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    if task["type"] in ("worker", "ps"):
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=task["type"], task_index=task["index"],
                                      protocol="grpc", start=True)
        server.join()
    return resolver


def pss_timed(coordinator, step, iterator, steps, batch, **extra):
    """Run ``steps`` of a ParameterServerStrategy ``step`` as its tutorial does at its best, and report them.

    20 warm-up steps first (tracing, first contact with every worker), then every timed step scheduled at
    once and one ``join()``: joining every few steps would drain the workers' queues each time.
    """
    started = time.time()
    for _ in range(20):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    first = time.time()
    for _ in range(steps):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    end = time.time()
    report(dict(examples_per_sec=steps * batch / (end - first), steps=steps, first_step_at=first, last_step_at=end,
                started=started, cluster_total=True, **extra))
