"""A task's life at run time: its server, how it ends, what it leaves on disk, and SIGTERM.

- :mod:`.server`: a task's server, readiness probes, bounded waits;
- :mod:`.shutdown`: how a ps ends: every trainer's done token, a drain on SIGTERM;
- :mod:`.checkpoints`: the chief's checkpoint dir, finding checkpoints, the done marker;
- :mod:`.preemption`: a SIGTERM noted, not fatal: training ends after a checkpoint.
"""
