#!/usr/bin/env python3
"""Host planning time of ``SparseAttentionWrapper.plan`` on CPU tensors (the CPU path) at the
Python benchmark's geometries (``bench/python/bench_torch_ops.py``): 1,048,576-token contexts,
page size 16, block tables a random permutation of the pool; 4:1 x 16, 32:1 x 32 and 32:2 x 16
sequences (q heads : KV heads x sequences); decode (one query per sequence: dense, and CISA with
G = 1) and terminal prefill of 512 queries (CISA with G = 4, 16, 32 on 4:1, G = 4 otherwise);
budget 4096 chunks, window 128 pages. Prints the median of --iters plans per case (ms).

    build/python-venv/bin/python python/examples/plan_timing.py [--iters 7] [--context 1048576]
"""
import argparse
import statistics
import time

import torch

import cisa

PAGE = 16
PREFILL = 512
GEOS = {"4:1": (4, 1, 16, [4, 16, 32]), "32:1": (32, 1, 32, [4]), "32:2": (32, 2, 16, [4])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=1048576)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--geometries", default="4:1,32:1,32:2")
    args = ap.parse_args()
    N = args.context
    pps = N // PAGE
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; context {N}, "
          f"budget {args.budget}, window {args.window}; median of {args.iters} plans")
    for geo in args.geometries.split(","):
        hq, hkv, seqs, gvals = GEOS[geo]
        P = seqs * pps
        gen = torch.Generator().manual_seed(42)
        tables = torch.randperm(P, generator=gen).to(torch.int32).view(seqs, pps).contiguous()
        seq_lens = torch.full((seqs,), N, dtype=torch.int64)
        for phase in ("decode", "prefill"):
            count = PREFILL if phase == "prefill" else 1
            entries = torch.tensor([[s, N - count, count] for s in range(seqs)],
                                   dtype=torch.int64)
            cases = [("dense", 0), ("cisa", 1)] if phase == "decode" else [
                ("cisa", G) for G in gvals]
            for method, G in cases:
                times = []
                for _ in range(args.iters):
                    w = cisa.SparseAttentionWrapper(num_kv_heads=hkv)
                    t0 = time.perf_counter()
                    w.plan(tables, seq_lens, entries, num_pages=P, dense=method == "dense",
                           budget=args.budget, window=args.window, qshare=max(G, 1))
                    times.append((time.perf_counter() - t0) * 1e3)
                    total = w.pages.numel()
                    del w
                label = f"{geo} x {seqs} {phase} {method}" + (f" G={G}" if G else "")
                print(f"{label:<28} plan {statistics.median(times):9.2f} ms  "
                      f"(min {min(times):8.2f}; {total:,} list entries)", flush=True)


if __name__ == "__main__":
    main()
