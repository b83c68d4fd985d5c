#!/usr/bin/env python3
"""Per-block timing of attention launches (probe build, /tmp/attn_probe.bin): launch spread,
what predicts a block's finish (co-resident blocks on its SM, its SM across launches, its list)."""
import sys, collections
import numpy as np
dt = np.dtype([('grid','u4'),('block','u4'),('smid','u4'),('pages','u4'),('list','u4'),('pad','u4'),
               ('t0','u8'),('t1','u8'),('t2','u8')])
r = np.fromfile(sys.argv[1], dtype=dt)
out = sys.argv[2] if len(sys.argv) > 2 else None
r = r[np.argsort(r['t0'])]
t0 = r['t0'].astype(np.int64)
cut = np.nonzero(np.diff(t0) > 20000)[0] + 1
groups = np.split(np.arange(len(r)), cut)
print(f"{len(r)} records, {len(groups)} launches")
kinds = collections.defaultdict(list)
for g in groups:
    x = r[g]
    if len(x) != x['grid'][0]:
        continue  # partial (ring wrap) or merged launches
    key = (int(x['grid'][0]), int(np.median(x['pages'])))
    kinds[key].append(x)
keep = {}
for key, ls in sorted(kinds.items()):
    grid, pages = key
    if len(ls) < 4:
        continue
    span, busy, s0, s1, lone_gap, n_lone = [], [], [], [], [], []
    sm_end = collections.defaultdict(list)
    list_end = collections.defaultdict(list)
    for x in ls:
        a0 = x['t0'].astype(np.int64); a1 = x['t1'].astype(np.int64); a2 = x['t2'].astype(np.int64)
        base = a0.min(); end = a2.max(); T = end - base
        span.append(T / 1e3)
        s0.append((a0.max() - base) / 1e3)
        s1.append((np.percentile(a2, 50) - base) / 1e3)
        cnt = collections.Counter(x['smid'].tolist())
        lone = np.array([cnt[s] == 1 for s in x['smid']])
        n_lone.append(lone.sum())
        if lone.any() and (~lone).any():
            lone_gap.append(((a2 - base)[lone].mean() - (a2 - base)[~lone].mean()) / 1e3)
        # SM busy share: per SM, union of its blocks' [t0, t2] over T
        sms = collections.defaultdict(list)
        for i in range(len(x)):
            sms[int(x['smid'][i])].append((a0[i], a2[i]))
        b = [ (max(e for _, e in v) - min(s for s, _ in v)) / T for v in sms.values()]
        busy.append((np.mean(b), np.min(b), len(sms)))
        for i in range(len(x)):
            sm_end[int(x['smid'][i])].append((a2[i] - base) / T)
            list_end[int(x['list'][i])].append((a2[i] - base) / T)
    dur = np.concatenate([(x['t2'].astype(np.int64) - x['t0'].astype(np.int64)) / 1e3 for x in ls])
    print(f"\n== grid {grid}, median pages/task {pages}: {len(ls)} launches")
    print(f"  launch span us: median {np.median(span):.1f} [min {min(span):.1f} max {max(span):.1f}]")
    print(f"  last block start after first us: median {np.median(s0):.2f}; median block end at {np.median(s1):.1f} us")
    print(f"  block duration us: p5 {np.percentile(dur,5):.1f} p50 {np.median(dur):.1f} p95 {np.percentile(dur,95):.1f} max {dur.max():.1f}")
    bm = np.array([b[0] for b in busy]); bmin = np.array([b[1] for b in busy])
    print(f"  SM busy (first start to last end of its blocks / launch span): mean {bm.mean()*100:.1f}%  least busy {np.median(bmin)*100:.1f}%  SMs used {busy[0][2]}")
    print(f"  SMs with one block: median {np.median(n_lone):.0f}; their blocks end {np.mean(lone_gap) if lone_gap else float('nan'):+.1f} us vs shared SMs' blocks")
    # systematic per SM? correlate mean end of SM over even vs odd launches
    ev = {s: np.mean(v[0::2]) for s, v in sm_end.items() if len(v) >= 4}
    od = {s: np.mean(v[1::2]) for s, v in sm_end.items() if len(v) >= 4}
    ks = sorted(set(ev) & set(od))
    if len(ks) > 10:
        c = np.corrcoef([ev[k] for k in ks], [od[k] for k in ks])[0, 1]
        print(f"  per-SM end (share of span): even/odd launch correlation {c:+.2f}; spread of SM means {np.std([np.mean(sm_end[k]) for k in ks])*100:.1f}% of span")
    lm = {k: np.mean(v) for k, v in list_end.items()}
    print(f"  per-list mean end: min {min(lm.values())*100:.1f}% max {max(lm.values())*100:.1f}% of span")
    keep[f"g{grid}_p{pages}"] = np.concatenate(ls[-40:])
if out:
    np.savez_compressed(out, **keep)
