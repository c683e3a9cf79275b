"""Calling a TF 1.x ``model_fn`` and ``input_fn`` with the arguments they take, and checking what they return."""

import functools
import inspect

import tensorflow as tf

from ..core.errors import ModelFnError
from ..data.pipeline import without_autotune_thread
from ..graph.model import split_element
from .spec import EstimatorSpec

tf1 = tf.compat.v1

MODEL_FN_ARGS = ("features", "labels", "mode", "params", "config")


def fn_args(fn) -> tuple:
    """The names ``fn`` takes (a partial's bound arguments left out; ``**kwargs`` as ``'**'``)."""
    if isinstance(fn, functools.partial):
        bound = set(fn.keywords or ())
        names = fn_args(fn.func)[len(fn.args):]
        return tuple(n for n in names if n not in bound)
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "__call__", fn)
    params = inspect.signature(target).parameters.values()
    return tuple("**" if p.kind == p.VAR_KEYWORD else p.name for p in params
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.VAR_KEYWORD))


def check_model_fn(model_fn, params):
    """Refuse, in one line, a model_fn that takes unknown arguments, or params it cannot take."""
    args = fn_args(model_fn)
    unknown = [a for a in args if a not in MODEL_FN_ARGS and a not in ("self", "**")]
    if unknown:
        raise ModelFnError(f"model_fn takes {', '.join(unknown)}; an Estimator passes only "
                           f"{', '.join(MODEL_FN_ARGS)}")
    if "features" not in args and "**" not in args:
        raise ModelFnError("model_fn must take a 'features' argument")
    if params is not None and "params" not in args and "**" not in args:
        raise ModelFnError("Estimator got params but model_fn takes no 'params' argument")


def call_estimator_model_fn(model_fn, features, labels, mode, params, config) -> EstimatorSpec:
    """``model_fn`` with the arguments it takes; its EstimatorSpec, checked for ``mode``."""
    args = fn_args(model_fn)
    given = {"features": features, "labels": labels, "mode": mode, "params": params, "config": config}
    kwargs = {k: v for k, v in given.items() if k in args or "**" in args}
    if "labels" not in kwargs and labels is not None and "**" not in args:
        raise ModelFnError("input_fn gave labels but model_fn takes no 'labels' argument")
    spec = model_fn(**kwargs)
    if not isinstance(spec, EstimatorSpec):
        if type(spec).__name__ == "EstimatorSpec" and hasattr(spec, "_asdict"):
            spec = EstimatorSpec(**spec._asdict())    # tensorflow_estimator's own, fields and all
        else:
            raise ModelFnError(f"model_fn must return tf.estimator.EstimatorSpec, got {type(spec).__name__}")
    if spec.mode != mode:
        spec = spec._replace(mode=mode)
    return spec


def call_input_fn(input_fn, mode, params, config, device: str = "/cpu:0", input_context=None):
    """``(features, labels, initializers, iterator)`` from ``input_fn``: a Dataset, or a ``(features, labels)`` pair.

    It runs on this worker's CPU, as TF 1.x's Estimator ran it; a Dataset is
    read through an initializable iterator whose initializer the session
    runs (again after each recovery); ``iterator`` is None for tensors. An
    ``input_fn`` with an ``input_context`` argument gets ``input_context``
    (a strategy's, else None), as TF 1.14's Estimator gave it.
    """
    args = fn_args(input_fn)
    given = {"mode": mode, "params": params, "config": config, "input_context": input_context}
    kwargs = {k: v for k, v in given.items() if k in args}
    if "params" in args and params is None:
        kwargs["params"] = {}
    with tf1.device(device):
        result = input_fn(**kwargs)
        if isinstance(result, tf.data.Dataset):
            iterator = tf1.data.make_initializable_iterator(without_autotune_thread(result))
            features, labels = split_element(iterator.get_next())
            return features, labels, [iterator.initializer], iterator
    if isinstance(result, (tuple, list)):
        if len(result) != 2:
            raise ModelFnError(f"input_fn returned {len(result)} values; return (features, labels), features, "
                               "or a tf.data.Dataset")
        return result[0], result[1], [], None
    return result, None, [], None

