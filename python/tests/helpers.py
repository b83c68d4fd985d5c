"""Test data and fp64 references for the cisa ops (independent of the engine)."""

from __future__ import annotations

import math

import torch


def make_cache(lens, num_kv_heads=2, head_dim=32, page_size=16, dtype=torch.float32, seed=0,
               spare_pages=3):
    """Random K/V rows per sequence, written into shuffled physical pages.
    Returns dict with k_rows/v_rows (float32 per sequence, as stored), k_cache, v_cache,
    block_tables (padded with -1), seq_lens, num_pages."""
    g = torch.Generator().manual_seed(seed)
    B, H, d = page_size, num_kv_heads, head_dim
    npages = [(n + B - 1) // B for n in lens]
    P = sum(npages) + spare_pages
    perm = torch.randperm(P, generator=g).to(torch.int32)
    k_cache = torch.zeros(P, H, B, d, dtype=dtype)
    v_cache = torch.zeros(P, H, B, d, dtype=dtype)
    maxp = max(npages) + 1
    tables = torch.full((len(lens), maxp), -1, dtype=torch.int32)
    k_rows, v_rows = [], []
    at = 0
    for s, n in enumerate(lens):
        k = torch.randn(n, H, d, generator=g).to(dtype)
        v = torch.randn(n, H, d, generator=g).to(dtype)
        pages = perm[at:at + npages[s]]
        at += npages[s]
        tables[s, :npages[s]] = pages
        for t in range(n):
            k_cache[pages[t // B], :, t % B] = k[t]
            v_cache[pages[t // B], :, t % B] = v[t]
        k_rows.append(k.float())
        v_rows.append(v.float())
    return dict(k_rows=k_rows, v_rows=v_rows, k_cache=k_cache, v_cache=v_cache,
                block_tables=tables, seq_lens=torch.tensor(lens, dtype=torch.int64), num_pages=P)


def entries_tensor(entries):
    return torch.tensor(entries, dtype=torch.int64).reshape(-1, 3)


def rows_of(entries):
    return sum(e[2] for e in entries)


def reference_attention(q, k_rows, v_rows, entries, groups, chunks, offsets, num_kv_heads,
                        page_size=16, scale=None):
    """fp64 softmax attention of every row over its group's listed chunks (causal s <= t)."""
    rows, hq, d = q.shape
    H, B = num_kv_heads, page_size
    hg = hq // H
    scale = scale or 1.0 / math.sqrt(d)
    out = torch.zeros(rows, hq, d, dtype=torch.float64)
    lse = torch.zeros(rows, hq, dtype=torch.float64)
    for gi, (e, first, last, row, _dense) in enumerate(groups.tolist()):
        seq = entries[e][0]
        K, V = k_rows[seq].double(), v_rows[seq].double()
        for kv in range(H):
            li = gi * H + kv
            cl = chunks[offsets[li]:offsets[li + 1]].tolist()
            for t in range(first, last + 1):
                pos = [c * B + s for c in cl for s in range(B) if c * B + s <= t]
                idx = torch.tensor(pos)
                r = row + (t - first)
                for h in range(kv * hg, (kv + 1) * hg):
                    s = (K[idx, kv] @ q[r, h].double()) * scale
                    m = s.max()
                    p = torch.exp(s - m)
                    out[r, h] = (p @ V[idx, kv]) / p.sum()
                    lse[r, h] = m + torch.log(p.sum())
    return out, lse


def reference_dense(q, k_rows, v_rows, entries, num_kv_heads, scale=None):
    """fp64 dense causal attention of every row over all positions s <= t."""
    rows, hq, d = q.shape
    hg = hq // num_kv_heads
    scale = scale or 1.0 / math.sqrt(d)
    out = torch.zeros(rows, hq, d, dtype=torch.float64)
    r = 0
    for seq, first, count in entries:
        K, V = k_rows[seq].double(), v_rows[seq].double()
        for t in range(first, first + count):
            for h in range(hq):
                kv = h // hg
                s = (K[:t + 1, kv] @ q[r, h].double()) * scale
                out[r, h] = torch.softmax(s, 0) @ V[:t + 1, kv]
            r += 1
    return out


def reference_topk(scores, k):
    """Indices of the k largest (larger first, then the smaller index; NaN below every number),
    ascending."""
    vals = scores.tolist()
    key = lambda i: (1, 0.0, i) if math.isnan(vals[i]) else (0, -vals[i], i)
    return sorted(sorted(range(len(vals)), key=key)[:k])


def fitted_indexer(n_layer, n_head, n_head_kv, head_dim, choices, arch="llama"):
    """A version-2 indexer (cisa calibrate --fit) built in memory for a model of this shape:
    ``choices`` maps (layer, kv_group) to the fit's coefficients (h_g * head_dim floats,
    [h_g][head_dim / 2][2]: the fit is chosen), a query head or None (the mean; the group still
    carries the mean's coefficients, as the writer stores a fit for every group)."""
    from cisa import indexer as ix
    hg = n_head // n_head_kv
    mean = [1.0 / hg if i % 2 == 0 else 0.0 for i in range(hg * head_dim)]
    groups = []
    for (layer, g), c in sorted(choices.items()):
        cands = [ix.Candidate(g * hg + i, 0.5, 0.5) for i in range(hg)]
        cands += [ix.Candidate(ix.MEAN, 0.4, 0.6), ix.Candidate(ix.FIT, 0.3, 0.7)]
        if c is None:
            chosen, mix = hg, mean
        elif isinstance(c, int):
            chosen, mix = c - g * hg, mean
        else:
            chosen, mix = hg + 1, [float(v) for v in c]
        groups.append(ix.Group(layer, g, 8, 0.9, cands, chosen, mix))
    idx = ix.Indexer(arch, "synthetic", n_layer, 64, n_head, n_head_kv, head_dim, 0, 3, 1, 0,
                     16, 8, 0, "kl", True, 0.05, [], groups, "<synthetic>")
    ix._validate(idx, ValueError)  # what the file reader checks
    return idx
