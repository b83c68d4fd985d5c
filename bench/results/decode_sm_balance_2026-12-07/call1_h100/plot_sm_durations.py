#!/usr/bin/env python3
"""Per-SM mean duration of decode attention blocks (probe.npz from probe_analyze.py): one bar
an SM, blocks of SMs that ran one block apart. Usage: plot_sm_durations.py probe.npz out.png"""
import collections, sys
import numpy as np
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

z = np.load(sys.argv[1])
fig, axes = plt.subplots(len(z.files), 1, figsize=(11, 3.2 * len(z.files)), squeeze=False)
for ax, key in zip(axes[:, 0], sorted(z.files)):
    x = z[key]
    t0 = x["t0"].astype(np.int64)
    order = np.argsort(t0)
    x, t0 = x[order], t0[order]
    groups = np.split(np.arange(len(x)), np.nonzero(np.diff(t0) > 20000)[0] + 1)
    dur = collections.defaultdict(list)
    lone = set()
    for g in groups:
        y = x[g]
        cnt = collections.Counter(y["smid"].tolist())
        for r in y:
            s = int(r["smid"])
            if cnt[s] == 1:
                lone.add(s)
            dur[s].append((int(r["t2"]) - int(r["t0"])) / 1e3)
    sms = sorted(dur)
    mean = [np.mean(dur[s]) for s in sms]
    colors = ["tab:orange" if s in lone else "tab:blue" for s in sms]
    ax.bar(sms, mean, color=colors, width=0.85)
    lo = min(mean)
    ax.set_ylim(lo * 0.9, max(mean) * 1.02)
    pages = key.split("_p")[1]
    ax.set_title(f"decode attention, 4:1 x 16, {pages} pages a task ({len(groups)} launches): "
                 "mean block duration by SM (orange: SMs that held one block)")
    ax.set_xlabel("SM (%smid)")
    ax.set_ylabel("us")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
