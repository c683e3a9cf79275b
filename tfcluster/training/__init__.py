"""Training: ``fit`` and its evaluator on top, then the session, its loop and the loop's hooks.

The path of ``fit``, top down: :mod:`.train` (``fit``, its options and result)
builds a strategy's graph (:mod:`tfcluster.strategies`), then runs it on a
:mod:`.session` (roles, fast readiness, bounded recovery), whose chief gets its
model through :mod:`.chief`; :mod:`.loop` steps the session and calls the
:mod:`.hooks` around every step. Beside them: :mod:`.liveness` (the chief's
heartbeat), :mod:`.train_metrics` (metrics over every replica, epochs) and
:mod:`.evaluation` (evaluate, predict and the evaluator task).
"""
