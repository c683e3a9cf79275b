"""What several commands share: the cluster options, the command and where it starts, options from
the environment, the strategy option.

``--ps`` and ``--chief`` say where tasks are in the commands that join or
inspect an existing cluster (``start``, ``status``: ``--ps H:P,...``,
``--chief H:P``), and how many to make in the commands that make one
(``local``, ``spec``: ``--ps N``, ``--chief``). The values cannot be mistaken
for each other, so each command names the other form when given it.
"""

import argparse
import logging
import os
import re
import sys

from ..core import environment
from ..core.errors import TfclusterError
from ..topology.cluster import TASK_TYPES, Cluster, LegacyFlags

log = logging.getLogger("tfcluster")

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def host_list(text: str) -> str:
    """An argparse type: addresses ``H:P,...``; a bare number is a count, which only local and spec take."""
    if text.strip().isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is a number of tasks; here it takes addresses, H:P,... (tfcluster local and spec "
            "take a number of tasks)")
    return text


def task_count(text: str) -> int:
    """An argparse type: a number of tasks; addresses belong to start and status."""
    if ":" in text:
        raise argparse.ArgumentTypeError(
            f"{text!r} is an address; here it takes a number of tasks (tfcluster start and status take "
            "addresses, H:P,...)")
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def add_cluster_args(p, task=True):
    """Options that say where the cluster's tasks live, shared by several commands."""
    g = p.add_argument_group("cluster (one source; default: the TF_CONFIG environment variable)")
    g.add_argument("--cluster", metavar="FILE",
                   help="JSON file: {\"worker\": [...], \"ps\": [...]} or the TF_CONFIG shape")
    g.add_argument("--ps", dest="ps_hosts", metavar="H:P,...", type=host_list,
                   help="ps addresses, comma-separated (in local and spec, --ps N is a number of tasks)")
    g.add_argument("--worker", dest="worker_hosts", metavar="H:P,...", type=host_list,
                   help="worker addresses, comma-separated")
    g.add_argument("--chief", dest="chief_hosts", metavar="H:P", type=host_list,
                   help="the chief's address (in local and spec, --chief adds a chief)")
    g.add_argument("--ps_hosts", dest="ps_hosts", type=host_list, help=argparse.SUPPRESS)
    g.add_argument("--worker_hosts", dest="worker_hosts", type=host_list, help=argparse.SUPPRESS)
    g.add_argument("--slurm", action="store_true",
                   help="read Slurm's environment (SLURM_PROCID, SLURM_STEP_NODELIST, ...)")
    g.add_argument("--slurm-ps", type=int, default=0, metavar="N",
                   help="with --slurm: the first N tasks are ps (default 0)")
    g.add_argument("--slurm-port-base", type=int, default=8888, metavar="P",
                   help="with --slurm: first port on each node (default 8888)")
    if task:
        t = p.add_argument_group("this task")
        t.add_argument("--job", "--job_name", dest="job", metavar="JOB",
                       help=f"this task's job ({', '.join(TASK_TYPES)}, or any job of the cluster)")
        t.add_argument("--task", "--task_index", dest="task", type=int, metavar="I", help="this task's index")


def cluster_from_args(args, need_task=True) -> Cluster:
    """Resolve the cluster (and this task) from parsed args, in one clear order."""
    hosts = [args.ps_hosts, args.worker_hosts, args.chief_hosts]
    sources = [n for n, used in (("--cluster", args.cluster), ("host lists", any(h is not None for h in hosts)),
                                 ("--slurm", args.slurm)) if used]
    if len(sources) > 1:
        raise TfclusterError(f"give one cluster source, not {' and '.join(sources)}")
    job, index = getattr(args, "job", None), getattr(args, "task", None)
    if args.cluster:
        cluster = Cluster.from_file(args.cluster)
    elif sources == ["host lists"]:
        cluster = Cluster.from_hosts(ps=args.ps_hosts, worker=args.worker_hosts, chief=args.chief_hosts)
    elif args.slurm:
        cluster = Cluster.from_slurm(ps=args.slurm_ps, port_base=args.slurm_port_base)
    else:
        cluster = Cluster.from_environment()
        if cluster is None:
            raise TfclusterError("no cluster given: use --cluster FILE, --ps/--worker host lists, --slurm or "
                                 "TF_CONFIG")
    if (job is None) != (index is None):
        raise TfclusterError("--job and --task go together; give both or neither")
    if job is not None:
        cluster = cluster.with_task(job, index)
    if need_task and cluster.task is None:
        raise TfclusterError("which task is this? give --job and --task (or a TF_CONFIG with a 'task')")
    return cluster


def add_legacy_flags_arg(p, help_text: str):
    """``--legacy-flags [STYLE]``: a :class:`LegacyFlags` style, ``all`` when the flag is given bare."""
    p.add_argument("--legacy-flags", nargs="?", const=LegacyFlags.ALL.value, default=LegacyFlags.NONE.value,
                   choices=[style.value for style in LegacyFlags], metavar="STYLE", help=help_text)


def add_run_args(p):
    """Options about the command a task runs: TF1 mode, the strategy, TF's logs."""
    p.add_argument("--tf1", action="store_true",
                   help="run 'python script.py' in TF1 mode: 'import tensorflow as tf' gives tf.compat.v1, "
                        "tf.contrib and tensorflow.examples...mnist work (docs/tf1.md)")
    p.add_argument("--tf2", action="store_true",
                   help="run 'python script.py' in TF2 mode: a tf.distribute program of TF 2.0-2.15 unchanged, its "
                        "MirroredStrategy one model over every worker (docs/tf2.md)")
    from ..strategies import STRATEGY_ENV, names
    p.add_argument("--no-session-fixes", action="store_true",
                   help="with --legacy-flags and no --tf1, run a Python script bare: without TF1 mode's session "
                        "fixes (0.2 s readiness polls, a late worker that does not wait for a finished chief, "
                        "falsely rejected steps rerun; docs/tf1.md)")
    p.add_argument("--strategy", choices=names(), metavar="NAME",
                   help=f"the strategy tfcluster.fit uses when the script names none ({STRATEGY_ENV}); one of "
                        f"{', '.join(names())}")
    from ..graph.wire import WIRE_ENV, WIRES
    p.add_argument("--wire", choices=WIRES, metavar="TYPE",
                   help=f"the type weights and gradients travel in between ps and workers (or in all-reduce) "
                        f"when the script's strategy names none ({WIRE_ENV}): {', '.join(WIRES)}; the ps keeps "
                        "float32")
    from ..graph.precision import MATH_ENV, MATHS
    p.add_argument("--math", choices=MATHS, metavar="TYPE",
                   help=f"the math of the trainers' matrix products ({MATH_ENV}): auto (the default: bfloat16 where "
                        "the CPU has AVX512-BF16 or AMX, float32 elsewhere), bfloat16 or float32; variables and "
                        "optimizer state stay float32")
    p.add_argument("--verbose", action="store_true", help="show TensorFlow's C++ logs (and debug lines)")


def program_mode(args):
    """``"TF1 mode"``, ``"TF2 mode"`` or None, as the flags ask; one line when they ask for both."""
    tf1, tf2 = getattr(args, "tf1", False), getattr(args, "tf2", False)
    if tf1 and tf2:
        raise TfclusterError("--tf1 and --tf2 exclude each other: a program is written for TF 1.x or for TF 2")
    return "TF1 mode" if tf1 else "TF2 mode" if tf2 else None


def task_command(args) -> list:
    """The command to run: with --tf1, ``python script.py`` becomes ``python -m tfcluster.tf1 script.py``
    (``-m tfcluster.tf2`` with --tf2).

    With --legacy-flags and no --tf1 a Python script still gets TF1 mode's
    session fixes (``-m tfcluster.tf1 --session-fixes-only``): such scripts
    make their own MonitoredTrainingSession, whose non-chief, without them,
    can wait forever for a chief that already finished (docs/tf1.md).
    """
    from ..tf1 import tf1_command
    from ..tf2 import tf2_command
    command = list(args.command)
    mode = program_mode(args)
    if mode is not None:
        flag, written_for, rewrite = {"TF1 mode": ("--tf1", "TF 1.x", tf1_command),
                                      "TF2 mode": ("--tf2", "TF 2", tf2_command)}[mode]
        if not command:
            raise TfclusterError(f"{flag} runs a {written_for} script: give it after '--', e.g. -- python train.py")
        return rewrite(command)
    if getattr(args, "legacy_flags", LegacyFlags.NONE) != LegacyFlags.NONE and not getattr(args, "no_session_fixes", False):
        try:
            fixed = tf1_command(command, session_fixes_only=True)
        except TfclusterError:   # not a Python script: it runs as given
            return command
        if fixed != command:
            log.info("--legacy-flags: the script runs with TF1 mode's session fixes (--no-session-fixes: bare)")
        return fixed
    return command


def extra_environment(args) -> dict:
    """Variables every task's command gets from this command's options (the strategy, its wire, the math)."""
    from ..graph.wire import WIRE_ENV
    from ..strategies import STRATEGY_ENV
    env = {STRATEGY_ENV: args.strategy} if getattr(args, "strategy", None) else {}
    if getattr(args, "wire", None):
        env[WIRE_ENV] = args.wire
    if getattr(args, "math", None):
        from ..graph.precision import MATH_ENV
        env[MATH_ENV] = args.math
    return env


# ------------------------------------------------------------------ where the command starts
def starts_a_command(word: str) -> bool:
    """True for a word that starts a command with no ``--`` before it: a script (``*.py``) or python."""
    return word.endswith(".py") or re.fullmatch(r"python[\d.]*", os.path.basename(word)) is not None


def _values_taken(action, rest) -> int:
    """How many of the words after an option are its value (argparse's rule, for the kinds we use)."""
    if action.nargs == 0 or not rest:
        return 0
    if action.nargs == "?":
        return int(rest[0] in (action.choices or ()))
    return 1


def _option(actions, word):
    """The action of an option word (``--max-restarts``, ``--max-r`` as argparse abbreviates, ``-o``)."""
    if word in actions:
        return actions[word]
    matches = {a for o, a in actions.items() if o.startswith("--") and o.startswith(word)}
    return matches.pop() if len(matches) == 1 else None


def split_command(parser, words, interpreter=None):
    """``(tfcluster's own words, the command)``: the command follows ``--``, or starts at the first word
    that is not an option or an option's value and is a script or ``python``. A script alone runs with
    ``interpreter`` (default: this Python)."""
    actions = parser._option_string_actions
    unknown = False         # after an unknown option, argparse says what is wrong
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return words[:i], words[i + 1:]
        if word.startswith("-") and word != "-":
            name, attached = (word.split("=", 1)[0], "=" in word) if word.startswith("--") else \
                (word[:2], len(word) > 2)
            action = _option(actions, name)
            unknown = unknown or action is None
            i += 1 + (0 if action is None or attached else _values_taken(action, words[i + 1:]))
            continue
        if starts_a_command(word):
            command = words[i:]
            if word.endswith(".py"):
                command = [interpreter or sys.executable] + command
            return words[:i], command
        if not unknown:
            raise TfclusterError(f"{word!r} is not an option, a script or python: put the command after '--' "
                                 f"(... -- {' '.join(words[i:i + 2])})")
        i += 1
    return words, []


# ------------------------------------------------------------------ options from the environment
def _env_value(action, name: str, text: str):
    flag = next(o for o in action.option_strings if o.startswith("--"))
    if action.nargs == 0:
        if text.strip().lower() in _TRUE:
            return action.const
        if text.strip().lower() in _FALSE:
            return action.default
        raise TfclusterError(f"{name}={text!r} sets {flag}: use 1 (on) or 0 (off)")
    kind = {int: "a whole number", float: "a number"}.get(action.type, "a value")
    try:
        value = action.type(text) if action.type else text
    except argparse.ArgumentTypeError as e:
        raise TfclusterError(f"{name}={text!r} sets {flag}: {e}") from None
    except (ValueError, TypeError):
        raise TfclusterError(f"{name}={text!r} is not {kind} (it sets {flag})") from None
    if action.choices is not None and value not in action.choices:
        raise TfclusterError(f"{name}={text!r} sets {flag}, which takes one of: {', '.join(map(str, action.choices))}")
    return value


def environment_defaults(parser, environ=None) -> dict:
    """``{dest: value}`` from the ``TFCLUSTER_<OPTION>`` variables set for a command's options.

    They become the options' defaults, so the command line wins; a bad value
    is one error naming the variable.
    """
    env = os.environ if environ is None else environ
    defaults = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        name = environment.option_variable(longs[0])
        if name in env:
            defaults[action.dest] = _env_value(action, name, env[name])
    return defaults
