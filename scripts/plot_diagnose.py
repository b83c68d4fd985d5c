#!/usr/bin/env python3
"""Plot `cisa diagnose` results (SPEC section 9) per global layer.

    python3 scripts/plot_diagnose.py diagnose.json out.png

The JSON is what `cisa diagnose --json` prints (or the .json written beside --plot's PNG).
Three panels: dense mass on the attended pages (CISA's selection, the oracle top-k, recency only);
QShare retention and mass lost per group size G; selection overlap across lags with the window
against spending the same pages on more selected chunks. Needs matplotlib (pip install matplotlib).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        r = json.load(f)
    layers = r["layers"]
    if not layers:
        sys.exit("no layers in " + sys.argv[1])
    xs = list(range(len(layers)))
    names = [str(layer["layer"]) for layer in layers]
    fig, ax = plt.subplots(3, 1, figsize=(max(8, 0.4 * len(layers)), 11))

    w = 0.27
    for i, (key, label) in enumerate(
        [("oracle_mass", "oracle top-k"), ("cisa_mass", "CISA selection"), ("recency_mass", "recency only")]
    ):
        ax[0].bar([x + (i - 1) * w for x in xs], [100 * layer[key] for layer in layers], w, label=label)
    ax[0].set_title(f"dense mass attended (k={r['budget']}, W={r['window']})")
    ax[0].set_ylabel("% of the position's attention mass")
    ax[0].set_ylim(0, 100)

    for gi, g in enumerate(r["qshare"]):
        ax[1].plot(xs, [100 * layer["qshare_retention"][gi] for layer in layers], "o-", label=f"retention G={g}")
    ax1b = ax[1].twinx()
    for gi, g in enumerate(r["qshare"]):
        ax1b.plot(xs, [100 * layer["qshare_mass_lost"][gi] for layer in layers], "x--", label=f"mass lost G={g}")
    ax[1].set_title("QShare: retention |S_P ∩ S_t|/k and mass lost")
    ax[1].set_ylabel("retention %")
    ax1b.set_ylabel("mass lost, points")
    ax[1].set_ylim(0, 100)

    for li, lag in enumerate(r["lags"]):
        ax[2].plot(xs, [100 * layer["overlap"][li] for layer in layers], "o-", label=f"overlap lag {lag}")
    ax[2].plot(xs, [100 * layer["window_mass"] for layer in layers], "s-", label="window W pages")
    ax[2].plot(xs, [100 * layer["extra_mass_index"] for layer in layers], "^-", label="W more selected (index)")
    ax[2].plot(xs, [100 * layer["extra_mass_oracle"] for layer in layers], "v:", label="W more selected (oracle)")
    ax[2].set_title("overlap across lags; window vs more selection")
    ax[2].set_ylabel("%")
    ax[2].set_ylim(0, 100)

    for a in ax:
        a.set_xticks(xs)
        a.set_xticklabels(names, fontsize=7 if len(layers) > 12 else 9)
        a.set_xlabel("global layer")
    ax[0].legend(fontsize=8)
    h1, l1 = ax[1].get_legend_handles_labels()
    h2, l2 = ax1b.get_legend_handles_labels()
    ax[1].legend(h1 + h2, l1 + l2, fontsize=7)
    ax[2].legend(fontsize=7)
    idx = r.get("indexer", "")
    fig.suptitle(f"cisa diagnose: {r['architecture']}, {r['tokens']} tokens, {r['positions']} positions; indexer: {idx}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
