"""What a bench run writes: results.json, results.md, the README's table, and two plots.

results.md is also the README's Benchmarks table: ``--readme`` puts it
between the README's :data:`BEGIN` and :data:`END` marks, so the table the
README shows is always one run's, with its date, machine and command. The
plots need matplotlib (the ``bench`` extra): ``ratios.png`` has each figure as
a point with its min-max spread against its goal, one panel per workload,
tfcluster in one colour and each peer in its own; ``throughput.png`` has every
row's examples/s, grouped by what is compared.
"""

import json
import os

from figures import COLOURS, GROUPS, NOTES, PANELS, TRACED, summary

BEGIN = "<!-- bench:begin: scripts/bench.py --readme writes this table; edit the bench, not the table -->"
END = "<!-- bench:end -->"
#: The click-through rows' own table (``--rows 'ctr_*' --readme``), so either run leaves the other's in place.
CTR_BEGIN = "<!-- bench-ctr:begin: scripts/bench.py --rows 'ctr_*' --readme writes this table -->"
CTR_END = "<!-- bench-ctr:end -->"


def _verdict(f):
    return {True: "met", False: "**missed**", None: ""}[f.get("met")]


def markdown(thr, figs, extra, meta, traced) -> str:
    """The run as Markdown: when, where and how; every figure against its goal; every row; the traces."""
    lines = [f"Measured {meta['date']} on {meta['machine']} ({meta['mode']} mode, {meta['reps']} repeat(s), "
             f"{meta['steps']} steps), with `{meta['command']}`.", "",
             "| figure | median | spread (min-max) | goal | |", "|---|---|---|---|---|"]
    for k, v in figs.items():
        lines.append(f"| {k} | {v['median']:.2f} | {v['min']:.2f}-{v['max']:.2f} | {v['goal']} | {_verdict(v)} |")
    lines += [f"\n{note}" for panel, notes in NOTES.items() if any(v["panel"] == panel for v in figs.values())
              for note in notes]
    lines += ["", "| run | processes | median examples/s | spread |", "|---|---|---|---|"]
    listed = [k for group in GROUPS.values() for k in group]
    for k in listed + [k for k in thr if k not in listed and k not in TRACED]:
        s = summary(thr.get(k) or [])
        if s:
            lines.append(f"| {k} | {meta['layouts'].get(k, '')} | {s['median']:.0f} | {s['min']:.0f}-{s['max']:.0f} |")
    acc = extra.get("accuracy") or {}
    if acc:
        shown = "; ".join(f"{k.replace('_', ' ')} wire {v:.4f}" for k, v in acc.items() if v is not None)
        lines += ["", f"The README example's test accuracy (`examples/digits.py`, 1 ps + 2 workers): {shown}."]
    if traced:
        lines += ["", "Where a step's time goes (`scripts/bench/profile_step.py` on 1 ps + 2 workers; ms per step "
                      "summed over each op's instances, so lines overlap; RecvTensor includes waiting for the "
                      "sender):", "", "| case | task | step ms | received MB per step | top ops (device op ms) |",
                  "|---|---|---|---|---|"]
        for case, docs in traced.items():
            for d in docs:
                recv = ", ".join(f"{k} {v / 1e6:.2f}" for k, v in d["recv_bytes_per_step"].items())
                ops = "; ".join(f"{o['device']} {o['op']} {o['ms']:.2f}" for o in d["ops"][:6])
                lines.append(f"| {case} | {d['task']} | {d['step_ms']:.1f} | {recv} | {ops} |")
    return "\n".join(lines) + "\n"


def write(out, thr, figs, extra, meta, traced) -> str:
    """results.json, results.md and the plots in ``out``; returns the Markdown."""
    os.makedirs(out, exist_ok=True)
    doc = dict(meta, throughput={k: summary(v) for k, v in thr.items()}, figures=figs,
               pull_bytes_per_sec=summary(extra["pull"]), pull_whole_bytes_per_sec=summary(extra["pull_whole"]),
               tcp_bytes_per_sec=summary(extra["tcp"]), tf_import_seconds=summary(extra["tf_import"]),
               import_cpu_seconds={k: summary(v) for k, v in (extra.get("import_cpu") or {}).items()},
               import_peak_bytes={k: summary(v) for k, v in (extra.get("import_rss") or {}).items()},
               tf1_run_cpu_seconds={k: summary(v) for k, v in (extra.get("tf1_cpu") or {}).items()},
               tf1_run_wall_seconds={k: summary(v) for k, v in (extra.get("tf1_wall") or {}).items()},
               accuracy=extra.get("accuracy") or {}, profiles=traced)
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump(doc, fh, indent=2)
    md = markdown(thr, figs, extra, meta, traced)
    with open(os.path.join(out, "results.md"), "w") as fh:
        fh.write(md)
    try:
        _draw(out, figs, thr, meta)
    except ImportError:
        print("bench: matplotlib is not installed (pip install -e '.[bench]'); no plots", flush=True)
    return md


def _draw(out, figs, thr, meta):
    """ratios.png and throughput.png in ``out`` (ImportError without matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    plot_ratios(os.path.join(out, "ratios.png"), figs, meta)
    plot_throughput(os.path.join(out, "throughput.png"), thr, meta)


def replot(out):
    """The plots of ``out``'s results.json again (a run made where matplotlib was not installed)."""
    with open(os.path.join(out, "results.json")) as fh:
        doc = json.load(fh)
    _draw(out, doc["figures"], {k: v["values"] for k, v in doc["throughput"].items() if v}, doc)


def write_readme(path, md, out, begin=BEGIN, end=END):
    """Put ``md`` between the README's marks (``begin``, ``end``), with links to ``out``'s files."""
    with open(path) as fh:
        text = fh.read()
    if begin not in text or end not in text:
        raise SystemExit(f"bench: {path} has no {begin!r} ... {end!r} block to rewrite")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    rel = os.path.relpath(os.path.abspath(out), os.path.dirname(os.path.abspath(path)))
    links = (f"Raw results: [{rel}/results.json]({rel}/results.json); plots: [{rel}/ratios.png]({rel}/ratios.png) "
             f"(each figure against its goal), [{rel}/throughput.png]({rel}/throughput.png) (examples/s).")
    with open(path, "w") as fh:
        fh.write(f"{head}{begin}\n{md}\n{links}\n{end}{tail}")


def plot_ratios(path, figs, meta):
    """One panel per workload and unit (a ratio beside MB would sit at zero): each figure's median, its
    min-max spread, and its goal as a black bar."""
    import textwrap

    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    units = sorted({v.get("unit", "x") for v in figs.values()}, key=lambda u: u != "x")
    panels = [((p, u), [k for k, v in figs.items() if v["panel"] == p and v.get("unit", "x") == u])
              for p in PANELS for u in units]
    panels = [(p, ks) for p, ks in panels if ks]
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.0 + sum(0.42 * len(ks) + 0.8 for _, ks in panels)),
                             gridspec_kw=dict(height_ratios=[len(ks) + 1.2 for _, ks in panels]), squeeze=False)
    for ax, ((panel, unit), names) in zip(axes[:, 0], panels):
        for y, name in enumerate(names):
            f = figs[name]
            ax.errorbar([f["median"]], [y], xerr=[[f["median"] - f["min"]], [f["max"] - f["median"]]], fmt="o",
                        color=COLOURS.get(f["peer"], "#777777"), capsize=3, markersize=6)
            parts = f["goal"].split()
            if parts and parts[0] in (">=", "<="):
                ax.plot([float(parts[1])], [y], marker="|", color="black", markersize=16, markeredgewidth=2)
            ax.annotate(f"{f['median']:.2f}" + ("" if f["met"] is None else (" met" if f["met"] else " missed")),
                        (f["max"], y), xytext=(6, 7), textcoords="offset points", va="center", fontsize=8)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels([f"{n} (goal {figs[n]['goal'].split(' (')[0]})" if figs[n]["met"] is not None else n
                            for n in names], fontsize=8)
        ax.invert_yaxis()
        title = PANELS[panel] + ("" if unit == "x" else f" ({unit})")
        ax.set_title("\n".join(textwrap.wrap(title, 48)), fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
        lo, hi = ax.get_xlim()
        lo = min(lo, 0.0)  # from zero, so a 0.49 beside a 0.50 does not look like a gap
        ax.set_xlim(lo, hi + 0.12 * (hi - lo))
    handles = [Line2D([], [], marker="o", ls="", color=c, label=f"compared with {k}" if k != "tfcluster" else
                      "tfcluster against itself") for k, c in COLOURS.items()]
    handles.append(Line2D([], [], marker="|", ls="", color="black", markersize=12, markeredgewidth=2, label="goal"))
    fig.suptitle(f"tfcluster's figures: median and min-max of {meta['reps']} repeat(s), {meta['date']}, "
                 f"{meta['machine']}", fontsize=10)
    top = 1 - 0.75 / fig.get_figheight()
    fig.legend(handles=handles, fontsize=7, loc="upper center", ncol=4, bbox_to_anchor=(0.5, top + 0.005),
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, top - 0.01))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput(path, thr, meta):
    """Every row's examples/s (whole cluster; median with min-max), one panel per group of compared rows."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    groups = [(g, [k for k in ks if summary(thr.get(k) or [])]) for g, ks in GROUPS.items()]
    groups = [(g, ks) for g, ks in groups if ks]
    if not groups:
        return
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 1.0 + sum(0.4 * len(ks) + 0.8 for _, ks in groups)),
                             gridspec_kw=dict(height_ratios=[len(ks) + 1.2 for _, ks in groups]), squeeze=False)
    systems = meta.get("systems", {})
    for ax, (group, names) in zip(axes[:, 0], groups):
        s = [summary(thr[k]) for k in names]
        med = [x["median"] for x in s]
        ax.barh(range(len(names)), med, xerr=[[m - x["min"] for m, x in zip(med, s)],
                                              [x["max"] - m for m, x in zip(med, s)]],
                color=[COLOURS.get(systems.get(k), "#777777") for k in names], capsize=3)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels([f"{k} ({meta['layouts'].get(k, '')})" for k in names], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(group, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
        for y, m in enumerate(med):
            ax.annotate(f"{m:.0f}", (m, y), xytext=(4, -8), textcoords="offset points", fontsize=7)
    axes[-1, 0].set_xlabel("examples/s, whole cluster (median, min-max)")
    used = sorted({systems.get(k) for _, ks in groups for k in ks} - {None})
    fig.suptitle(f"throughput, {meta['date']}, {meta['machine']}", fontsize=10)
    top = 1 - 0.6 / fig.get_figheight()
    fig.legend(handles=[Patch(color=COLOURS[k], label=k) for k in used], fontsize=7, loc="upper center",
               ncol=len(used), bbox_to_anchor=(0.5, top + 0.005), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, top - 0.01))
    fig.savefig(path, dpi=110)
    plt.close(fig)
