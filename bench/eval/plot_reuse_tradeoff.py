#!/usr/bin/env python3
"""What selection reuse across decode steps buys and what it costs, on one axis: the share of
decode lists that kept their selection (reuse_lists_kept / all decode lists).

Left: the layer decode benchmark's speedup over the best dense kernel of the same device call,
as a function of that share. A reuse step's busy time is the per-step one with the selection
replaced by the measured fresh and kept selection times, busy(f) = setup + attention + other +
(1 - f) fresh + f kept (the formula `cisa bench layer` uses for its cisa-reuse rows, which are
the marked points f = (r - 1) / r).
Right: KL(dense || config) over the base configuration's on the same documents, with its 95%
bootstrap interval over documents (paired_vs_config.py), at the share of lists the configuration
kept in those documents: plain r = 2, 4, 8 (the new-chunks check) and the mass check.

  python3 bench/eval/plot_reuse_tradeoff.py --layer LAYER.json --anchors ANCHORS.json \\
      --runs LABEL=RUN_DIR ... --base cisa:x8:g4:s1:cal --out reuse.png     (needs matplotlib)
"""
import argparse
import collections
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paired_vs_config import doc_kl_rows  # noqa: E402


def speed_lines(layer, anchors):
    """{geometry: (best dense ms, fixed ms, fresh ms, kept ms, [(r, busy ms)])} from the layer
    benchmark's decode rows and the anchors of the same call."""
    best = {}
    for a in anchors["anchors"]:
        if a["phase"] == "decode":
            best[a["geometry"]] = min(best.get(a["geometry"], float("inf")), a["ms"])
    out = {}
    rows = [r for r in layer["results"] if r["phase"] == "decode"]
    for r in rows:
        g = r["geometry"]
        if r["method"] == "cisa" and g in best:
            fixed = r["setup_ms"] + r["attention_ms"] + r.get("other_ms", 0.0)
            out[g] = [best[g], fixed, None, None, []]
    for r in rows:
        g = r["geometry"]
        if r["method"] == "cisa-reuse" and g in out:
            out[g][2], out[g][3] = r["fresh_select_ms"], r["kept_select_ms"]
            out[g][4].append((r["reuse_steps"], r["busy_ms"]))
    return {g: v for g, v in out.items() if v[2] is not None}


def quality_points(label, run, base, rng):
    """[(label, config, length, docs, kept share, ratio, low, high)] for every configuration of
    a run's documents other than dense and the base."""
    rows = [json.loads(line) for line in open(os.path.join(run, "results.jsonl"))]
    docs = [r for r in rows if r["task"] == "doc"]
    kept = collections.defaultdict(lambda: [0, 0])
    for r in docs:
        s = r.get("stats", {})
        k = kept[(r["config"], r["length"])]
        k[0] += s.get("reuse_lists_kept", 0)
        k[1] += s.get("reuse_lists_kept", 0) + s.get("reuse_lists_selected", 0)
    out = []
    for cfg, length, n, ratio, lo, hi, _ in doc_kl_rows(docs, base, "", rng):
        k, total = kept[(cfg, length)]
        if total:
            out.append((label, cfg, length, n, k / total, ratio, lo, hi))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", required=True, help="cisa bench layer --json (decode rows)")
    ap.add_argument("--anchors", required=True, help="bench/python/anchors_layer.py --out")
    ap.add_argument("--runs", nargs="+", required=True, help="LABEL=RUN_DIR of cisa eval runs")
    ap.add_argument("--base", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    layer = json.load(open(a.layer))
    speed = speed_lines(layer, json.load(open(a.anchors)))
    if not speed:
        sys.exit("%s: no decode rows with selection reuse and an anchor" % a.layer)
    points, seen = [], set()
    for spec in a.runs:
        label, sep, run = spec.partition("=")
        if not sep:
            sys.exit("--runs takes LABEL=RUN_DIR, got %r" % spec)
        for p in quality_points(label, run, a.base, random.Random(a.seed)):
            if p[:3] not in seen:  # a configuration in two runs: the first run's
                seen.add(p[:3])
                points.append(p)
    if not points:
        sys.exit("no documents with reuse and the base configuration")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    f = [i / 100 for i in range(0, 96)]
    for i, (g, (dense, fixed, fresh, kept, marks)) in enumerate(sorted(speed.items())):
        line = left.plot(f, [dense / (fixed + (1 - x) * fresh + x * kept) for x in f], label=g)
        for r, busy in sorted(marks):
            x = (r - 1) / r
            left.plot([x], [dense / busy], "o", color=line[0].get_color())
            left.annotate("r=%d" % r, (x, dense / busy), textcoords="offset points",
                          xytext=(-22 + 14 * i, 6), fontsize=7, color=line[0].get_color())
        left.axhline(dense / fixed, color=line[0].get_color(), lw=0.6, ls=":")
    for goal in (9, 12):
        left.axhline(goal, color="gray", lw=0.8, ls="--")
        left.annotate("%dx" % goal, (0.0, goal), textcoords="offset points", xytext=(2, 2),
                      fontsize=7, color="gray")
    left.set_xlabel("share of decode lists that kept their selection")
    left.set_ylabel("decode speedup over the best dense kernel")
    left.set_title("layer decode, %s reps, %s tokens (dotted: selection free; dashed: goals)" %
                   (layer.get("rep_precision", "native"), format(layer.get("context", 0), ",")),
                   fontsize=9)
    left.grid(alpha=0.3)
    left.legend(fontsize=8)

    series = collections.defaultdict(list)
    for label, cfg, length, n, share, ratio, lo, hi in points:
        check = "mass" if ":m" in cfg.split(":r", 1)[-1] else "new-chunks"
        series[("%s, %d tokens (%d docs), %s" % (label, length, n, check))].append(
            (share, ratio, lo, hi, cfg))
    for name, pts in sorted(series.items()):
        pts.sort()
        right.errorbar([p[0] for p in pts], [p[1] for p in pts],
                       yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                       marker="s" if name.endswith("mass") else "o", capsize=3, label=name,
                       ls="none" if name.endswith("mass") else "-")
        for share, ratio, _, _, cfg in pts:
            right.annotate("r" + cfg.split(":r", 1)[-1], (share, ratio),
                           textcoords="offset points", xytext=(5, -3), fontsize=6)
    right.axhline(1.0, color="gray", lw=0.8, ls="--")
    right.set_xlabel("share of decode lists that kept their selection")
    right.set_ylabel("KL(dense || config) / KL at r = 1")
    right.set_title("quality, documents fed as decode steps (base %s)" % a.base, fontsize=9)
    right.grid(alpha=0.3)
    right.legend(fontsize=7)
    left.set_xlim(-0.02, 1.0)
    shares = [p[4] for p in points]  # the quality side zooms in on the shares measured
    right.set_xlim(max(0.0, min(shares) - 0.05), min(1.0, max(shares) + 0.08))
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.out, dpi=130)
    print("wrote %s" % a.out)


if __name__ == "__main__":
    main()
