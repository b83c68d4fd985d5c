#!/usr/bin/env python3
"""KL(dense || config) over a base configuration's, against prompt length, from one or more cisa
eval runs with long documents (the ratios and 95% bootstrap intervals of paired_vs_config.py):
one line per configuration, one point per (run, length), documents counted in the labels.

  python3 bench/eval/plot_kl_ratio.py RUN_DIR... --base cisa:x8:g4:s1:cal --out plot.png \\
      [--configs A,B] [--title TEXT]      (needs matplotlib)
"""
import argparse
import collections
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paired_vs_config import doc_kl_rows  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--base", required=True)
    ap.add_argument("--configs", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    series = collections.defaultdict(list)  # config -> [(length, ratio, lo, hi, docs)]
    for run in a.runs:
        docs = [json.loads(l) for l in open(os.path.join(run, "results.jsonl"))]
        docs = [r for r in docs if r["task"] == "doc"]
        for cfg, length, n, r, lo, hi, _ in doc_kl_rows(docs, a.base, a.configs,
                                                        random.Random(a.seed)):
            series[cfg].append((length, r, lo, hi, n))
    if not series:
        sys.exit("no documents with both the base and another configuration")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (cfg, pts) in enumerate(sorted(series.items())):
        pts.sort()
        x = [p[0] * (1 + 0.03 * (i - (len(series) - 1) / 2)) for p in pts]  # side by side
        y = [p[1] for p in pts]
        err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=cfg)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    lengths = sorted({p[0] for pts in series.values() for p in pts})
    docs = {p[0]: p[4] for pts in series.values() for p in pts}
    ax.set_xticks(lengths)
    ax.set_xticklabels(["%dK\n%d docs" % (round(n / 1024), docs[n]) for n in lengths])
    ax.set_xlabel("prompt length")
    ax.set_ylabel("KL(dense || config) / KL of %s" % a.base)
    ax.set_title(a.title or "KL against the base configuration, 95% bootstrap over documents")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
