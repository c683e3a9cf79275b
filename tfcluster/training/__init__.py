"""Training: ``fit`` and its evaluator on top, then the session, its loop and the loop's hooks.

The path of ``fit``, top down: :mod:`.train` (``fit``, its options and result)
builds a strategy's graph (:mod:`tfcluster.strategies`), then runs it on what
:mod:`.assembly` assembles for every front end (the task's part, its server, a
:mod:`.session` with roles, fast readiness and bounded recovery, the standard
hooks), whose chief gets its model through :mod:`.chief` and saves with a Saver from :mod:`.savers`
(sharded where every ps writes the checkpoint dir); :mod:`.loop` steps the session and calls the
:mod:`.hooks` around every step. Beside them: :mod:`.liveness` (the chief's
heartbeat), :mod:`.input_position` (each trainer's input position, saved so a
resumed run reads on), :mod:`.timer` (every N steps or seconds, for the hooks),
:mod:`.train_metrics` (metrics over every replica, epochs) and
:mod:`.evaluation` (evaluate, predict and fit's evaluator task), whose loop over
the checkpoints, shared with the Estimator's evaluator, is :mod:`.checkpoint_watch`.
"""
