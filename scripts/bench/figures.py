"""The bench's figures: which rows each ratio compares, its goal, the panel it is drawn in, and its peer.

A figure is the list of its per-repeat values (a ratio of two rows measured
side by side in the same repeat, or seconds), summarised as median and
min-max. Its goal says what it should reach and which way (``>=``, ``<=``);
``peer`` is what tfcluster is compared with (its colour in the plot), and
``panel`` the workload it belongs to.
"""

import functools
import statistics

#: Panels of the ratio plot, one per workload, in order.
PANELS = {
    "mlp": "MLP 784-512-10, batch 128 per worker",
    "big": "bigger MLP 784-2048-2048-10 (5.8M parameters), batch 64 per worker",
    "cnn": "tutorials' CNN",
    "ctr": "click-through wide & deep: 26 x H-row tables (H = 100,000 unless named), batch 512, 2 workers, 2 ps",
    "tf2": "TF 2 tutorials' CNN, fit and custom loop, global batch 128 (TF2 mode)",
    "hvd": "Horovod TF 1.x program (TF1 mode): the digits CNN, batch 128 per rank, 2 workers",
    "startup": "start-up and teardown, seconds",
    "pull": "pulling a 64 MB variable from a ps",
    "saves": "a full save of 2 ps' state (a 128 MB table and its slot, in 8 MB parts over both ps)",
    "drift": "an embedding variable on 1 ps, Zipf ids drifting by 100 a step, GlobalStepEvict(100), saves every 25",
    "stream": "click stream, ids drifting 0.5 an example (scripts/clicklog.py --drift): embedding variables "
              "(CounterFilter(2), GlobalStepEvict(100)) against H = 50,000, 2 workers, 2 ps",
    "accuracy": "README example (digits): test accuracy points, bfloat16 - float32 wire",
    "math": "bfloat16 math / float32 math (oneDNN's automatic mixed precision; the CPU's flags in the title)",
}

#: Colours: tfcluster in one, each peer in its own (Paul Tol's bright scheme, readable when printed grey).
COLOURS = {"tfcluster": "#4477aa", "raw TF1": "#ee6677", "TF2 PSS": "#228833", "one process": "#ccbb44",
           "TCP": "#66ccee", "plain TF": "#aa3377", "unsharded": "#bbbbbb"}

#: Throughput rows grouped by what is compared, for the absolute plot.
GROUPS = {
    "MLP on 1 ps + 2 workers": ["tfcluster_async", "tfcluster_async_bf16", "tfcluster_async_tf_threads",
                                "tfcluster_async_autotune",
                                "raw_tf1_async", "tf2_pss", "tfcluster_sync", "tfcluster_sync_bf16",
                                "tfcluster_async_1w"],
    "MLP in one process, and all-reduce": ["single_b128", "single_b256", "mirrored_2", "mirrored_4", "central_2",
                                           "collective_2w", "collective_2w_bf16", "collective_2w_towers_2",
                                           "tfcluster_sync_towers_2"],
    "bigger MLP": ["big_single", "big_single_f32", "big_async", "big_async_f32", "big_async_bf16", "big_sync",
                   "big_sync_bf16"],
    "CNN": ["single_cnn", "single_cnn_f32", "tfcluster_async_cnn", "tfcluster_async_cnn_f32"],
    "TF 2 tutorials' CNN (TF2 mode)": [f"tf2_{loop}_{how}" for loop in ("fit", "custom")
                                       for how in ("tfcluster", "by_hand", "single", "single_mode")],
    "Horovod program, digits CNN (TF1 mode)": ["hvd_cnn", "hvd_cnn_fp16", "hvd_cnn_collective", "hvd_cnn_single"],
    "click-through, 2 workers (2 ps unless named)": ["ctr_async", "ctr_async_f32", "ctr_async_noprefetch",
                                                     "ctr_async_1ps", "ctr_links", "ctr_links_noprefetch",
                                                     "ctr_sync", "ctr_raw_tf1", "ctr_raw_tf1_mode",
                                                     "ctr_tf2_pss", "ctr_async_h10k", "ctr_async_h1m", "ctr_sync_h1m",
                                                     "ctr_async_ev", "ctr_stream", "ctr_stream_ev",
                                                     "ctr_stream_f32", "ctr_stream_noprefetch", "ctr_async_bf16",
                                                     "ctr_async_columns", "ctr_async_columns_bf16"],
}
#: What a peer cannot express, said in the table instead of a figure, per panel.
NOTES = {"ctr": ["TF2 PSS has no synchronous training (ParameterServerStrategy's workers each apply their own "
                 "gradients), so C6 has no TF2 PSS row; raw TF1 would need SyncReplicasOptimizer, not measured."]}
#: Rows that trace a few steps and stop: their bytes are figures, their examples/s are not.
TRACED = ("ctr_traffic", "ctr_traffic_bf16", "ctr_traffic_columns")

#: The one-process MLP rows; P4 compares a cluster with the best of them, repeat by repeat.
SINGLES = ("single_b128", "single_b256", "mirrored_2", "mirrored_4", "central_2")


def summary(values):
    """Median, min, max and count of the values that are not None (None: there are none)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return dict(median=statistics.median(values), min=min(values), max=max(values), n=len(values), values=values)


def ratio(a, b):
    """Per-repeat ratios a[i]/b[i] (the pairs were measured side by side; a failed repeat is None)."""
    return [x / y for x, y in zip(a, b) if x and y]


def best(a, b):
    """Per-repeat best of two rows (None where both failed)."""
    return [max([v for v in pair if v], default=None) for pair in zip(a, b)]


def met(goal, median):
    """True/False when ``goal`` (``>= 1.2``, ``<= 7.0 (...)``) is met by ``median``; None without a goal."""
    parts = (goal or "").split()
    if len(parts) < 2 or parts[0] not in (">=", "<="):
        return None
    target = float(parts[1])
    return median >= target if parts[0] == ">=" else median <= target


def _first_steps_after_launch(run):
    firsts = [] if run is None else [r["first_step_at"] for r in run["results"]]
    return None if not firsts or None in firsts else max(firsts) - run["launched"]   # a worker that never stepped: none


def _teardown_seconds(run):
    lasts = [] if run is None else [r["last_step_at"] for r in run["results"] if r["last_step_at"] is not None]
    return None if not lasts else run["exited"] - max(lasts)


def figures(runs, thr, extra):
    """``{figure name: summary + goal, met, panel, peer, unit}`` of every figure this run's rows allow."""
    out = {}

    def add(name, values, panel, peer, goal="", unit="x"):
        s = summary(values)
        if s:
            out[name] = dict(s, goal=goal, met=met(goal, s["median"]), panel=panel, peer=peer, unit=unit)

    def pair(name, a, b, panel, peer, goal=""):
        if thr.get(a) and thr.get(b):
            add(name, ratio(thr[a], thr[b]), panel, peer, goal)

    pair("P1 tfcluster async / raw TF1 async", "tfcluster_async", "raw_tf1_async", "mlp", "raw TF1", ">= 1.2")
    pair("P2 tfcluster async / TF2 PSS", "tfcluster_async", "tf2_pss", "mlp", "TF2 PSS", ">= 1.5")
    pair("P3 tfcluster sync / async", "tfcluster_sync", "tfcluster_async", "mlp", "tfcluster", ">= 0.85")
    pair("P3 with a bfloat16 wire: sync / async", "tfcluster_sync_bf16", "tfcluster_async_bf16", "mlp",
         "tfcluster", ">= 0.85")
    singles = [thr[k] for k in SINGLES if thr.get(k)]
    if singles and thr.get("tfcluster_async"):
        top = functools.reduce(best, singles)
        add("P4 cluster total / best single process", ratio(thr["tfcluster_async"], top), "mlp", "one process",
            ">= 0.5")
        if thr.get("tfcluster_async_tf_threads"):
            add("P4 with TF's own thread pools (--threads-per-task 0)", ratio(thr["tfcluster_async_tf_threads"], top),
                "mlp", "one process", ">= 0.5")
        if thr.get("tfcluster_async_bf16"):
            add("P4 with a bfloat16 wire", ratio(thr["tfcluster_async_bf16"], top), "mlp", "one process", ">= 0.5")
    pair("W1 bfloat16 wire / float32 wire, async", "tfcluster_async_bf16", "tfcluster_async", "mlp", "tfcluster")
    pair("W1 bfloat16 wire / float32 wire, sync", "tfcluster_sync_bf16", "tfcluster_sync", "mlp", "tfcluster")
    pair("threads sized by tfcluster / TF's own (async)", "tfcluster_async", "tfcluster_async_tf_threads", "mlp",
         "tfcluster")
    pair("input without / with tf.data's autotune thread (async)", "tfcluster_async", "tfcluster_async_autotune",
         "mlp", "tfcluster", ">= 0.95")
    pair("collective: bfloat16 / float32 all-reduce", "collective_2w_bf16", "collective_2w", "mlp", "tfcluster")
    pair("async 2 workers / async 1 worker", "tfcluster_async", "tfcluster_async_1w", "mlp", "tfcluster")
    for n in (2, 4):
        pair(f"towers {n} virtual devices / single_b128", f"mirrored_{n}", "single_b128", "mlp", "one process")
    pair("central storage 2 devices / single_b128", "central_2", "single_b128", "mlp", "one process")
    pair("collective 2 workers / single_b128", "collective_2w", "single_b128", "mlp", "one process")
    pair("collective 2 workers x 2 towers / single_b128", "collective_2w_towers_2", "single_b128", "mlp",
         "one process")
    pair("ps sync x 2 towers / ps sync", "tfcluster_sync_towers_2", "tfcluster_sync", "mlp", "tfcluster")
    for loop, shape in (("fit", "fit"), ("custom", "custom loop")):
        pair(f"T1 TF2 {shape}: tfcluster --tf2 / TF's MultiWorkerMirroredStrategy by hand", f"tf2_{loop}_tfcluster",
             f"tf2_{loop}_by_hand", "tf2", "plain TF", ">= 1.0")
        pair(f"T2 TF2 {shape}: 2 workers / one process on the same global batch", f"tf2_{loop}_tfcluster",
             f"tf2_{loop}_single", "tf2", "one process")
        pair(f"T3 TF2 {shape}: TF2 mode / plain TF, one process", f"tf2_{loop}_single_mode", f"tf2_{loop}_single",
             "tf2", "one process", ">= 0.98")
    pair("H1 Horovod program (TF1 mode) / tfcluster's collective strategy, same CNN, 2 workers", "hvd_cnn",
         "hvd_cnn_collective", "hvd", "tfcluster", ">= 0.95")
    pair("H2 Horovod program: 2 workers / one process", "hvd_cnn", "hvd_cnn_single", "hvd", "one process")
    pair("H3 Horovod program: Compression.fp16 / none, 2 workers", "hvd_cnn_fp16", "hvd_cnn", "hvd", "tfcluster")
    pair("W2 bigger MLP: bfloat16 wire / float32 wire, async", "big_async_bf16", "big_async", "big", "tfcluster",
         ">= 1.3")
    pair("W2 bigger MLP: bfloat16 wire / float32 wire, sync", "big_sync_bf16", "big_sync", "big", "tfcluster",
         ">= 1.3")
    pair("P3 bigger MLP: sync / async", "big_sync", "big_async", "big", "tfcluster", ">= 0.85")
    pair("P3 bigger MLP, bfloat16 wire: sync / async", "big_sync_bf16", "big_async_bf16", "big", "tfcluster",
         ">= 0.85")
    pair("P4 bigger MLP: cluster (async, bfloat16 wire) / one process", "big_async_bf16", "big_single", "big",
         "one process")
    pair("P4 for the CNN: cluster total / single process", "tfcluster_async_cnn", "single_cnn", "cnn",
         "one process", ">= 0.9")
    _math(thr, extra, add, pair)
    _startup(out, runs, extra, add)
    _ctr(runs, thr, add, pair)
    return out


def _math(thr, extra, add, pair):
    """B1-B6: bfloat16 math against float32 (graph/precision.py), in examples/s and in the accuracy kept."""
    for name, a, b in (("B5 bigger MLP, one process", "big_single", "big_single_f32"),
                       ("B5 bigger MLP, async on 1 ps + 2 workers", "big_async", "big_async_f32"),
                       ("B6 tutorials' CNN, one process", "single_cnn", "single_cnn_f32"),
                       ("B6 tutorials' CNN, async on 1 ps + 2 workers", "tfcluster_async_cnn",
                        "tfcluster_async_cnn_f32")):
        pair(f"{name}: bfloat16 math / float32 math", a, b, "math", "tfcluster", ">= 1.5")
    digits = extra.get("digits_math") or {}
    add("B4 README example (digits, sync): test accuracy points, bfloat16 math - float32 math",
        [100 * (a - b) for a, b in zip(digits.get("bfloat16") or [], digits.get("float32") or [])
         if a is not None and b is not None], "math", "tfcluster", ">= -0.5", unit="points")


def _per_run(runs, name, value):
    """``value(run)`` for each repeat of row ``name`` (None where it failed)."""
    return [None if r is None else value(r) for r in runs.get(name) or []]


def _traffic(run, what):
    """Mean over the run's workers of ``what(traffic)``, from their traced steps."""
    found = [what(r["traffic"]) for r in run["results"] if r.get("traffic")]
    found = [v for v in found if v is not None]     # a figure this run's traces do not hold
    return sum(found) / len(found) if found else None


def _received_ratio(t):
    return t["worker_received"] / (t["row_bytes"] + t["dense_bytes"])


#: Op types that apply a sparse update to a variable (the traced steps' stats), by type name or prefix: runs that
#: predate ``ps_updates`` (one per variable, tfcluster.StepTraffic.updates_on) counted these.
SPARSE_UPDATES = ("ResourceSparseApply", "SparseApply", "ResourceScatter")


def _ps_updates(traffic):
    """Variables each ps updated by rows per step, averaged over the ps tasks (older runs: their update ops)."""
    per_ps = list((traffic.get("ps_updates") or {}).values())
    if not per_ps:
        per_ps = [sum(n for kind, n in ops.items() if kind.startswith(SPARSE_UPDATES))
                  for ops in (traffic.get("ps_ops") or {}).values()]
    return sum(per_ps) / len(per_ps) if per_ps else None


def _ps_balance(run):
    """Busiest ps's bytes (received and sent) over the mean ps's, summed over the workers' traced steps."""
    per_ps = {}
    for r in run["results"]:
        for task, (got, sent) in ((r.get("traffic") or {}).get("by_task") or {}).items():
            if task.startswith("ps:"):
                per_ps[task] = per_ps.get(task, 0.0) + got + sent
    return max(per_ps.values()) / (sum(per_ps.values()) / len(per_ps)) if len(per_ps) > 1 else None


def _ps_peak_mb(run):
    """The ps tasks' peak memory added up, in MB (None: the run did not measure it)."""
    return sum((run.get("ps_peak") or {}).values()) / 1e6 or None


def _beyond_state(run):
    """The largest (peak - bytes of variables held) over the run's ps tasks, in MB."""
    peaks, state = run.get("ps_peak") or {}, run.get("ps_state") or {}
    gaps = [(peaks[t] - state[t]) / 1e6 for t in peaks if t in state]
    return max(gaps) if gaps else None


def _ctr(runs, thr, add, pair):
    """The click-through figures (docs/embeddings.md): bytes per step, peers, table size, ps count, sync, wire."""
    add("C1 bytes a worker receives per step / (touched rows + dense weights)",
        _per_run(runs, "ctr_traffic", lambda r: _traffic(r, _received_ratio)), "ctr", "tfcluster", "<= 1.2")
    add("C1 bytes the ps receive per step / (touched rows + dense weights)",
        _per_run(runs, "ctr_traffic", lambda r: _traffic(r, lambda t: t["ps_received"] / (t["row_bytes"]
                                                                                        + t["dense_bytes"]))),
        "ctr", "tfcluster", "<= 1.2")
    pair("C2 tfcluster async / raw TF1 async (by hand)", "ctr_async", "ctr_raw_tf1", "ctr", "raw TF1", ">= 1.5")
    pair("C2 the raw TF1 program under --tf1 / as it runs alone", "ctr_raw_tf1_mode", "ctr_raw_tf1", "ctr",
         "raw TF1", "measured")
    pair("C3 tfcluster async / TF2 PSS (Keras Embedding on ShardedVariables)", "ctr_async", "ctr_tf2_pss", "ctr",
         "TF2 PSS", ">= 2.0")
    pair("B1 click-through: bfloat16 math / float32 math", "ctr_async", "ctr_async_f32", "ctr", "tfcluster",
         ">= 1.3")
    pair("B2 click-through: next step's rows fetched during this one / not", "ctr_async", "ctr_async_noprefetch",
         "ctr", "tfcluster", ">= 1.0")
    pair("B2 the same where a link binds (1 ps, hosts of their own, 200 Mbit/s links)", "ctr_links",
         "ctr_links_noprefetch", "ctr", "tfcluster", ">= 1.0")
    aucs = {k: _per_run(runs, k, _auc) for k in ("ctr_stream", "ctr_stream_f32", "ctr_stream_noprefetch")}
    for name, other in (("B3 stream: held-out AUC points, bfloat16 math - float32 math", "ctr_stream_f32"),
                        ("B3 stream: held-out AUC points, rows prefetched - not (async's staleness)",
                         "ctr_stream_noprefetch")):
        add(name, [100 * (a - b) for a, b in zip(aucs["ctr_stream"], aucs[other]) if a is not None and b is not None],
            "stream", "tfcluster", ">= -0.2", unit="points")
    pair("C4 async at H = 1,000,000 / at H = 10,000", "ctr_async_h1m", "ctr_async_h10k", "ctr", "tfcluster",
         ">= 0.9")
    pair("C5 async on 2 ps / on 1 ps", "ctr_async", "ctr_async_1ps", "ctr", "tfcluster", ">= 1.0")
    pair("E1 embedding variables / fixed tables (H = 100,000): examples/s", "ctr_async_ev", "ctr_async", "ctr",
         "tfcluster", ">= 0.9")
    peaks = {k: _per_run(runs, k, _ps_peak_mb)
             for k in ("ctr_async_ev", "ctr_async")}
    add("E1 embedding variables / fixed tables (H = 100,000): the ps' peak memory",
        ratio(peaks["ctr_async_ev"], peaks["ctr_async"]), "ctr", "tfcluster", "measured")
    _stream(runs, add, pair)
    for name, row in (("C5 MB a ps holds beyond its variables (peak - state), 2 ps", "ctr_async"),
                      ("C5 MB a ps holds beyond its variables (peak - state), 1 ps", "ctr_async_1ps")):
        add(name, _per_run(runs, row, _beyond_state), "ctr", "tfcluster", "<= 400", unit="MB")
    pair("C6 sync / async at H = 1,000,000", "ctr_sync_h1m", "ctr_async_h1m", "ctr", "tfcluster", ">= 0.85")
    pair("C6 sync / async at H = 100,000", "ctr_sync", "ctr_async", "ctr", "tfcluster")
    add("C7 busiest ps's traffic / mean ps's (Zipf-hot rows; dense split as on 2 machines)",
        _per_run(runs, "ctr_traffic", _ps_balance), "ctr", "tfcluster", "<= 1.2")
    received = {k: _per_run(runs, k, lambda r: _traffic(r, lambda t: t["worker_received"])) for k in TRACED}
    add("C8 bfloat16 wire / float32 wire: bytes a worker receives per step",
        [a / b for a, b in zip(received["ctr_traffic_bf16"], received["ctr_traffic"]) if a and b], "ctr",
        "tfcluster", "<= 0.55")
    pair("C8 bfloat16 wire / float32 wire: examples/s", "ctr_async_bf16", "ctr_async", "ctr", "tfcluster", ">= 1.2")
    # Per ps and step, from the traced steps: sparse updates (one per table part) and the transfers that carry
    # data each way (TF's control edges are RecvTensor calls too, without bytes: not counted).
    for row, of in (("ctr_traffic", ""), ("ctr_traffic_columns", ", a table per column (52 variables)")):
        # Two row widths (deep 16, wide 1): at best one update of each a ps. Two transfers each way: the ids,
        # then the gradients; the weights, then the rows (the chief's ps also sends the global step).
        add(f"C9 sparse updates per ps per step{of}", _per_run(runs, row, lambda r: _traffic(
            r, _ps_updates)), "ctr", "tfcluster", "<= 2", unit="ops")
        for name, i in (("C9 data transfers a worker sends each ps per step", 2),
                        ("C9 data transfers a worker receives from each ps per step", 3)):
            add(name + of, _per_run(runs, row, lambda r, i=i: _traffic(r, lambda t: _per_ps(t, i))), "ctr",
                "tfcluster", "<= 2", unit="tensors")
    for name, key in (("C9 tensors a worker sends the ps per step (one RecvTensor call each)", "tensors_to_ps"),
                      ("C9 tensors a worker receives from the ps per step", "tensors_from_ps")):
        add(name, _per_run(runs, "ctr_traffic", lambda r: _traffic(r, lambda t: t.get(key))), "ctr", "tfcluster",
            "measured", unit="tensors")
    pair("C10 a table per column (52 variables) / one table of every column: examples/s", "ctr_async_columns",
         "ctr_async", "ctr", "tfcluster", ">= 0.9")
    pair("C10 on a bfloat16 wire: a table per column / one table: examples/s", "ctr_async_columns_bf16",
         "ctr_async_bf16", "ctr", "tfcluster", ">= 0.9")


def _per_ps(traffic, i):
    """Item ``i`` of the traced step's ``requests`` ([to, from, to with data, from with data]), averaged over ps."""
    per_ps = [counts[i] for counts in (traffic.get("requests") or {}).values()]
    return sum(per_ps) / len(per_ps) if per_ps else None


def _auc(run):
    """The held-out AUC the run's chief reported (None: it reported none)."""
    return next((x["auc"] for x in run["results"] if "auc" in x), None)


def _stream(runs, add, pair):
    """E1 and E2 on the drifting click stream: embedding variables against fixed tables of their memory."""
    pair("E1 stream: embedding variables / fixed tables of the same memory: examples/s", "ctr_stream_ev",
         "ctr_stream", "stream", "tfcluster", ">= 0.9")
    peaks = {k: _per_run(runs, k, _ps_peak_mb)
             for k in ("ctr_stream_ev", "ctr_stream")}
    add("E1 stream: the ps' peak memory, same (1 = the same memory)", ratio(peaks["ctr_stream_ev"],
                                                                          peaks["ctr_stream"]),
        "stream", "tfcluster", "measured")
    aucs = {k: _per_run(runs, k, _auc) for k in ("ctr_stream_ev", "ctr_stream")}
    add("E2 stream: held-out AUC points, embedding variables - fixed tables of the same memory",
        [100 * (a - b) for a, b in zip(aucs["ctr_stream_ev"], aucs["ctr_stream"]) if a is not None and b is not None],
        "stream", "tfcluster", ">= 0", unit="points")


def _startup(out, runs, extra, add):
    """P5, P6 (seconds), P7 (pull speed), P8 (a hosted ps's import), P9 (TF1 tasks forked) and the README example's
    accuracy with each wire."""
    if runs.get("tfcluster_async") and extra.get("tf_import"):
        imp = statistics.median(extra["tf_import"])
        add("P5 s launch to every first step (tfcluster)",
            [_first_steps_after_launch(r) for r in runs["tfcluster_async"]], "startup", "tfcluster",
            f"<= {imp + 2:.1f} (TF import {imp:.1f} + 2)", unit="s")
        add("P6 s last step to every process gone", [_teardown_seconds(r) for r in runs["tfcluster_async"]],
            "startup", "tfcluster", "<= 2", unit="s")
    cpu, rss = extra.get("import_cpu") or {}, extra.get("import_rss") or {}
    if cpu.get("ps") and cpu.get("trainer"):
        add("P8 a hosted ps's TensorFlow import / a trainer's: CPU seconds", ratio(cpu["ps"], cpu["trainer"]),
            "startup", "a trainer", "<= 0.85")
        add("P8 a hosted ps's TensorFlow import / a trainer's: peak memory", ratio(rss["ps"], rss["trainer"]),
            "startup", "a trainer", "<= 0.95")
    tf1_cpu, tf1_wall = extra.get("tf1_cpu") or {}, extra.get("tf1_wall") or {}
    if tf1_cpu.get("fork") and tf1_cpu.get("no_fork"):
        add("P9 a TF1 run's tasks forked / each importing TensorFlow: CPU seconds (1 ps + 2 workers, empty script)",
            ratio(tf1_cpu["fork"], tf1_cpu["no_fork"]), "startup", "--no-fork", "<= 0.8")
        add("P9 a TF1 run's tasks forked / each importing TensorFlow: wall seconds",
            ratio(tf1_wall["fork"], tf1_wall["no_fork"]), "startup", "--no-fork", "<= 0.9")
    if runs.get("tfcluster_async_autotune"):
        add("P6 with tf.data's autotune thread (the input's own choice)",
            [_teardown_seconds(r) for r in runs["tfcluster_async_autotune"]], "startup", "tfcluster", "peer", unit="s")
    if runs.get("raw_tf1_async"):
        add("P5 s launch to every first step (raw TF1)", [_first_steps_after_launch(r) for r in runs["raw_tf1_async"]],
            "startup", "raw TF1", "peer", unit="s")
    if extra.get("pull"):
        add("P7 ps pull bytes/s / TCP loopback bytes/s", ratio(extra["pull"], extra["tcp"]), "pull", "TCP", ">= 0.5")
        add("P7 one whole variable, as plain TF places it / TCP", ratio(extra["pull_whole"], extra["tcp"]), "pull",
            "plain TF", "peer")
    drift = [r for r in extra.get("drift") or [] if r and r.get("end")]
    if drift:
        add("E3 ps memory after 10x the ids of its steady state, with eviction / at steady state",
            [r["end"]["rss"] / r["steady"]["rss"] for r in drift], "drift", "steady state", "<= 1.2")
        add("E3 embedding-variable rows, same", [r["end"]["rows"] / r["steady"]["rows"] for r in drift], "drift",
            "steady state", "measured")
    saves = [r for r in extra.get("saves") or [] if r]
    if saves:
        add("S1 full save seconds, 2 ps: sharded / unsharded",
            [statistics.median(r["sharded_seconds"]) / statistics.median(r["unsharded_seconds"]) for r in saves],
            "saves", "unsharded", "<= 0.6")
        add("S2 restore seconds per GB of ps state (sharded)",
            [statistics.median(r["restore_seconds"]) / (r["state_bytes"] / 1e9) for r in saves], "saves",
            "tfcluster", "measured", unit="s")
        add("S2 save seconds per GB of ps state (sharded)",
            [statistics.median(r["sharded_seconds"]) / (r["state_bytes"] / 1e9) for r in saves], "saves",
            "tfcluster", "measured", unit="s")
        evs = [r["embedding"] for r in saves if r.get("embedding")]
        if evs:
            add("S3 incremental save bytes / full save bytes, 1 % of an embedding variable's rows touched",
                [statistics.median(e["increment_bytes"]) / statistics.median(e["full_bytes"]) for e in evs], "saves",
                "full save", "<= 0.05")
            add("S3 incremental save seconds / full save seconds, same",
                [statistics.median(e["increment_seconds"]) / statistics.median(e["full_seconds"]) for e in evs],
                "saves", "full save", "measured")
            add("S4 restore seconds per GB of embedding-variable state (a full checkpoint and its increment)",
                [statistics.median(e["restore_seconds"]) / (statistics.median(e["full_bytes"]) / 1e9) for e in evs],
                "saves", "tfcluster", "measured", unit="s")
    acc = extra.get("accuracy") or {}
    for mode in ("sync", "async"):
        a, b = acc.get(f"{mode}_bfloat16"), acc.get(f"{mode}_float32")
        if a is not None and b is not None:
            add(f"digits {mode}: test accuracy with bfloat16 wire - float32 wire (points)", [100 * (a - b)],
                "accuracy", "tfcluster", ">= -1", unit="points")
