#!/usr/bin/env python3
"""Plots of a `cisa eval` run directory (needs matplotlib: `pip install matplotlib`).

  python3 scripts/plot_eval.py RUN_DIR [RUN_DIR ...] [-o OUT_DIR]

Reads RUN_DIR/results.jsonl of every run given (their lines are pooled) and writes to OUT_DIR
(default: the first RUN_DIR):
  accuracy_vs_length.png  task accuracy (mean over tasks of the task means) against prompt
                          length, one line per configuration;
  accuracy_vs_budget.png  task accuracy against the nominal remote compression x (dense at x = 1),
                          one line per length and family (kind, G, options);
  kl_vs_budget.png        mean KL(dense || config) per token on the long documents against the
                          nominal remote compression x (budget k = E/x), one line per length and
                          family (kind, G, query; marker shape = length), log-scaled axes;
  kl_vs_length.png        the same KL against prompt length, one line per configuration.
"""
import argparse
import collections
import json
import math
import os
import re
import sys


def load(run_dirs):
    recs = []
    for d in run_dirs:
        path = os.path.join(d, "results.jsonl")
        if not os.path.exists(path):
            sys.exit("plot_eval.py: no %s" % path)
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut by an interrupted write
    return recs


def compression_of(name):
    m = re.search(r":x([0-9.]+)", name)
    return float(m.group(1)) if m else None


def family_of(name):
    # The config without its budget: cisa:x8:g4:last -> cisa:g4:last
    return ":".join(p for p in name.split(":") if not re.fullmatch(r"[xk][0-9.]+", p))


def accuracy(recs):
    # (config, length) -> {task: [scores]}
    acc = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in recs:
        if r.get("task") == "doc" or "score" not in r:
            continue
        acc[(r["config"], r["length"])][r["task"]].append(r["score"])
    out = collections.defaultdict(dict)
    for (cfg, length), tasks in acc.items():
        out[cfg][length] = 100.0 * sum(sum(v) / len(v) for v in tasks.values()) / len(tasks)
    return out


def mean_kl(recs):
    per = collections.defaultdict(list)  # (config, length) -> per-document mean KL
    for r in recs:
        if r.get("task") == "doc" and r.get("kl"):
            per[(r["config"], r["length"])].append(sum(r["kl"]) / len(r["kl"]))
    return {k: sum(v) / len(v) for k, v in per.items()}


def plot_by_budget(ax, values, extra=None, transform=lambda v: v):
    """One line per (family, length) of values[(config, length)] against the nominal compression x;
    extra(length) -> (x, value) or None adds a point (dense at x = 1)."""
    import matplotlib.pyplot as plt
    series = collections.defaultdict(list)  # (family, length) -> [(x, value)]
    for (cfg, length), v in values.items():
        x = compression_of(cfg)
        if x is not None:
            series[(family_of(cfg), length)].append((x, v))
    colors = plt.get_cmap("tab20").colors  # more series than the default 10-colour cycle
    markers = "osD^v<>ph*"
    lengths = sorted({length for _, length in series})
    for i, ((fam, length), pts) in enumerate(sorted(series.items())):
        point = extra(length) if extra else None
        if point:
            pts.append(point)
        pts.sort()
        ax.plot([p[0] for p in pts], [transform(p[1]) for p in pts], color=colors[i % len(colors)],
                marker=markers[lengths.index(length) % len(markers)], markersize=7,
                linestyle="-" if len(pts) > 1 else "none", label="%s @ %d" % (fam, length))
    ax.set_xscale("log", base=2)


def length_axis(ax, lengths):
    """Log2 x axis of prompt lengths labelled 4K, 8K, ..."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([("%dK" % (x // 1024)) if x % 1024 == 0 else str(x) for x in lengths])
    ax.set_xlabel("prompt length (tokens)")


def finish_accuracy(fig, ax, title, path, legend_size):
    """The axis label, grid, legend and file shared by the accuracy plots."""
    ax.set_ylabel("task accuracy (points)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def finish_kl(fig, ax, title, path):
    """The goal line, log KL axis, legend and file shared by the KL plots."""
    ax.axhline(0.02, color="red", linestyle="--", linewidth=1, label="goal 0.02 nats/token")
    ax.set_yscale("log")
    ax.set_ylabel("mean KL(dense || config), nats/token")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("-o", "--out", default=None)
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_eval.py: matplotlib is missing (pip install matplotlib)")
    out = args.out or args.run_dirs[0]
    os.makedirs(out, exist_ok=True)
    recs = load(args.run_dirs)
    written = []

    acc = accuracy(recs)
    if acc:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        colors = plt.get_cmap("tab20").colors
        for i, cfg in enumerate(sorted(acc, key=lambda c: (c != "dense", c))):
            xs = sorted(acc[cfg])
            style = dict(color="black", linewidth=2.5) if cfg == "dense" else dict(color=colors[i % len(colors)])
            ax.plot(xs, [acc[cfg][x] for x in xs], marker="o", label=cfg, **style)
        length_axis(ax, sorted({x for c in acc for x in acc[c]}))
        ax.set_ylim(-2, 102)
        path = os.path.join(out, "accuracy_vs_length.png")
        finish_accuracy(fig, ax, "RULER-style accuracy against length", path, 8)
        written.append(path)

    if acc:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        dense = acc.get("dense", {})
        plot_by_budget(ax, {(c, length): v for c, by in acc.items() for length, v in by.items()},
                       extra=lambda length: (1.0, dense[length]) if length in dense else None)
        ax.set_xlabel("nominal remote compression x (k = E / x; dense at x = 1)")
        path = os.path.join(out, "accuracy_vs_budget.png")
        finish_accuracy(fig, ax, "RULER-style accuracy against budget", path, 7)
        written.append(path)

    kl = mean_kl(recs)
    if kl:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        plot_by_budget(ax, kl, transform=lambda v: max(v, 1e-6))
        ax.set_xlabel("nominal remote compression x (k = E / x)")
        path = os.path.join(out, "kl_vs_budget.png")
        finish_kl(fig, ax, "Long-document KL against budget", path)
        written.append(path)

    if kl:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        colors = plt.get_cmap("tab20").colors
        by_cfg = collections.defaultdict(list)
        for (cfg, length), v in kl.items():
            by_cfg[cfg].append((length, v))
        for i, cfg in enumerate(sorted(by_cfg)):
            pts = sorted(by_cfg[cfg])
            ax.plot([p[0] for p in pts], [max(p[1], 1e-6) for p in pts], color=colors[i % len(colors)],
                    marker="o", label=cfg)
        length_axis(ax, sorted({length for _, length in kl}))
        path = os.path.join(out, "kl_vs_length.png")
        finish_kl(fig, ax, "Long-document KL against length", path)
        written.append(path)

    for p in written:
        print(p)
    if not written:
        sys.exit("plot_eval.py: nothing to plot")


if __name__ == "__main__":
    main()
