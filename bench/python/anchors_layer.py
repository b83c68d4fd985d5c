#!/usr/bin/env python3
"""PyTorch anchors for `cisa bench layer`, measured in the same device session, and the combined report.

Run on the GPU machine after `cisa bench layer --json --dump-lists DIR > cisa.json`:

    python3 bench/python/anchors_layer.py --lists DIR --cisa cisa.json --out results.json

Measures, for the geometries of the cisa run (d = 128, bf16, history N):
  * ceilings: device-to-device copy (TB/s, bytes read + written) and a bf16 8192^3 matmul (TFLOP/s);
  * dense: SDPA with the cuDNN and the FlashAttention backends (enable_gqa, no mask; queries at the end);
  * sparse, at CISA's token budget: gather-then-FlashAttention using CISA's own per-group page lists
    (read from DIR, the same selections, so the same bytes), and FlexAttention with a block mask of
    128-token blocks, one random selection of the same token count per 128 queries (coarser than
    CISA's per-G selections, which flatters it).
Every time is the median of --iters CUDA-event timings after warm-up, on random data.
Prints one table: times, ratios to the best dense kernel of the same run, TB/s and TFLOP/s.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

D = 128
B = 16


def median_ms(fn, iters, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def ceilings(iters):
    n = 4 << 30  # 4 GiB: far past the 60 MB L2
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = median_ms(lambda: dst.copy_(src), iters)
    copy_tb_s = 2 * n / (t * 1e-3) / 1e12
    del src, dst
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t = median_ms(lambda: a @ b, iters)
    return {"copy_tb_s": copy_tb_s, "matmul_tflop_s": 2 * 8192**3 / (t * 1e-3) / 1e12}


def read_lists(path):
    with open(path, "rb") as f:
        num_groups, num_kv = np.frombuffer(f.read(16), dtype=np.int64)
        groups = np.frombuffer(f.read(24 * int(num_groups)), dtype=np.int64).reshape(-1, 3)
        offsets = np.frombuffer(f.read(8 * (int(num_groups) * int(num_kv) + 1)), dtype=np.int64)
        chunks = np.frombuffer(f.read(), dtype=np.int32)
    return groups, int(num_kv), offsets, chunks


def sdpa(q, k, v, backend):
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def gather_then_fa(k, v, q, lists, hq, iters):
    """Per sequence: gather each group's listed pages into a contiguous K/V, then FlashAttention."""
    groups, hkv, offsets, chunks = lists
    hg = hq // hkv
    seqs = k.shape[0]
    per_seq = []  # (sequence, KV group, token indices [n_groups, L*16], group size)
    # Lists differ by at most one tail page; all are cut to the shortest so each batch is dense.
    min_len = int(np.min(offsets[1:] - offsets[:-1]))
    for s in range(seqs):
        sel = np.nonzero(groups[:, 0] == s)[0]
        gsz = int(groups[sel[0], 2] - groups[sel[0], 1] + 1)
        for g in range(hkv):
            idx = np.stack([chunks[offsets[i * hkv + g]: offsets[i * hkv + g] + min_len] for i in sel])
            tok = (idx[:, :, None].astype(np.int64) * B + np.arange(B)[None, None, :]).reshape(len(sel), -1)
            per_seq.append((s, g, torch.from_numpy(tok).cuda(), gsz))

    def run():
        for s, g, tok, gsz in per_seq:
            kk = k[s, g][tok]  # [n_groups, L*16, d]: the gathered copy
            vv = v[s, g][tok]
            n = tok.shape[0]
            qq = q[s, g * hg:(g + 1) * hg, : n * gsz].reshape(hg, n, gsz, D).transpose(0, 1).contiguous()
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                F.scaled_dot_product_attention(qq, kk[:, None], vv[:, None], enable_gqa=True)

    return median_ms(run, iters), min_len


def flex_block_sparse(k, v, q, pages_per_list, iters):
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    seqs, hkv, n, _ = k.shape
    hq, lq = q.shape[1], q.shape[2]
    kv_blocks = n // 128
    q_blocks = max(1, lq // 128)
    sel = -(-pages_per_list * B // 128)  # same token count in 128-token blocks
    g = torch.Generator(device="cuda").manual_seed(0)
    scores = torch.rand(seqs, hq, q_blocks, kv_blocks, device="cuda", generator=g)
    idx = scores.topk(sel, dim=-1).indices.sort(dim=-1).values.to(torch.int32)
    # kv_indices must span every KV block (only the first kv_num_blocks entries are read).
    idx = torch.cat([idx, torch.zeros(*idx.shape[:-1], kv_blocks - sel, dtype=torch.int32, device="cuda")], -1)
    num = torch.full((seqs, hq, q_blocks), sel, dtype=torch.int32, device="cuda")
    bm = BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=(128, 128), seq_lengths=(lq, n))
    fn = torch.compile(flex_attention)
    return median_ms(lambda: fn(q, k, v, block_mask=bm, enable_gqa=True), iters), sel


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lists", required=True, help="directory of page lists written by cisa bench layer")
    ap.add_argument("--cisa", required=True, help="JSON document of cisa bench layer --json")
    ap.add_argument("--out", required=True, help="combined JSON results")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--commit", default=os.environ.get("CISA_COMMIT", "unknown"))
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--gather-geometries", default="all",
                    help="comma-separated geometries (e.g. 4:1) that also time gather-then-FlashAttention "
                         "(the 32:1 and 32:2 prefill runs take ~40 s of device time); default all")
    ap.add_argument("--flex-only", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.flex_only:
        name, seqs, pages, n, lq = args.flex_only.split(",")
        hq, hkv = (int(x) for x in name.split(":"))
        k = torch.randn(int(seqs), hkv, int(n), D, dtype=torch.bfloat16, device="cuda")
        v = torch.randn_like(k)
        q = torch.randn(int(seqs), hq, int(lq), D, dtype=torch.bfloat16, device="cuda")
        t, nblk = flex_block_sparse(k, v, q, int(pages), args.iters)
        print(json.dumps({"ms": t, "blocks": nblk}))
        return 0
    cisa = json.load(open(args.cisa))
    n = int(cisa["context"])
    pre = int(cisa["prefill_queries"])
    torch.manual_seed(0)
    out = {
        "gpu": torch.cuda.get_device_name(),
        "driver": subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip(),
        "torch": torch.__version__,
        "commit": args.commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "bench/scripts/gpu_session.sh all (cisa bench layer --backend cuda --json --dump-lists; "
                   "python3 bench/python/anchors_layer.py)",
        "cisa": cisa,
        "ceilings": ceilings(args.iters),
        "anchors": [],
    }
    print("ceilings:", json.dumps(out["ceilings"]), flush=True)
    geos = []
    for r in cisa["results"]:
        key = (r["geometry"], r["seqs"])
        if key not in geos:
            geos.append(key)
    phases = {r["phase"] for r in cisa["results"]}
    flex_jobs = []
    for name, seqs in geos:
        hq, hkv = (int(x) for x in name.split(":"))
        k = torch.randn(seqs, hkv, n, D, dtype=torch.bfloat16, device="cuda")
        v = torch.randn_like(k)
        for phase, lq in (("prefill", pre), ("decode", 1)):
            if phase not in phases:  # a `cisa bench layer --phase decode` document: decode anchors only
                continue
            q = torch.randn(seqs, hq, lq, D, dtype=torch.bfloat16, device="cuda")
            flop = 4.0 * seqs * hq * lq * n * D
            byts = 2.0 * seqs * hkv * n * D * 2
            for label, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                rec = {"geometry": name, "seqs": seqs, "phase": phase, "method": label}
                try:
                    t = median_ms(lambda: sdpa(q, k, v, be), args.iters)
                    rec.update(ms=t, tb_s=byts / (t * 1e-3) / 1e12, tflop_s=flop / (t * 1e-3) / 1e12)
                except Exception as e:  # a backend that refuses the shape is recorded, not fatal
                    rec["error"] = str(e).split("\n")[0][:200]
                out["anchors"].append(rec)
                print(json.dumps(rec), flush=True)
            for r in cisa["results"]:
                if r["method"] != "cisa" or r["geometry"] != name or r["phase"] != phase:
                    continue
                if args.gather_geometries != "all" and name not in args.gather_geometries.split(","):
                    continue
                path = os.path.join(args.lists, r["tag"] + ".bin")
                if not os.path.exists(path):
                    continue
                lists = read_lists(path)
                rec = {"geometry": name, "seqs": seqs, "phase": phase, "method": "gather+flash", "G": r["G"]}
                try:
                    t, length = gather_then_fa(k, v, q, lists, hq, args.iters)
                    rec.update(ms=t, pages_per_list=length)
                except Exception as e:
                    rec["error"] = str(e).split("\n")[0][:200]
                out["anchors"].append(rec)
                print(json.dumps(rec), flush=True)
                if phase == "prefill" and not args.no_flex and name == "4:1" and r["G"] == 32:
                    flex_jobs.append((name, seqs, int(r["list_pages"] / r["lists"])))
            del q
        del k, v
        torch.cuda.empty_cache()

    for name, seqs, pages in flex_jobs:
        rec = {"geometry": name, "seqs": seqs, "phase": "prefill", "method": "flex-block128",
               "note": "one random selection per 128 queries, same token count"}
        p = subprocess.run([sys.executable, __file__, "--flex-only", "%s,%d,%d,%d,%d" % (name, seqs, pages, n, pre),
                            "--iters", str(args.iters), "--lists", "-", "--cisa", "-", "--out", "-"],
                           capture_output=True, text=True, timeout=300)
        try:
            rec.update(json.loads(p.stdout.strip().splitlines()[-1]))
        except Exception:
            rec["error"] = (p.stderr.strip().splitlines() or ["no output"])[-1][:300]
        out["anchors"].append(rec)
        print(json.dumps(rec), flush=True)

    # Combined table: ratios to the best dense kernel of this run (ours included).
    rows = []
    for name, seqs in geos:
        for phase in ("prefill", "decode"):
            dense = [a for a in out["anchors"] if a["geometry"] == name and a["phase"] == phase
                     and a["method"] in ("cudnn", "flash") and "ms" in a]
            ours_dense = [r for r in cisa["results"] if r["geometry"] == name and r["phase"] == phase and r["method"] == "dense"]
            cands = [(a["ms"], a["method"]) for a in dense] + [(r["busy_ms"], "cisa-dense") for r in ours_dense]
            if not cands:
                continue
            best, best_name = min(cands)
            for ms, lab in cands:
                rows.append((name, phase, lab, "", ms, best / ms))
            for r in cisa["results"]:
                if r["method"] == "cisa" and r["geometry"] == name and r["phase"] == phase:
                    r["ratio_vs_best_dense"] = best / r["busy_ms"]
                    r["best_dense"] = best_name
                    rows.append((name, phase, "cisa", "G=%d" % r["G"], r["busy_ms"], best / r["busy_ms"],
                                 r["attention_ms"], r["scoring_ms"], r["topk_ms"], r["setup_ms"], r["other_ms"],
                                 r["attention_tb_s"], r["attention_tflop_s"]))
            for r in cisa["results"]:  # the same steps replayed as one CUDA graph (no stage gaps)
                if r["method"] == "cisa" and r["geometry"] == name and r["phase"] == phase and "step_ms" in r:
                    r["step_ratio_vs_best_dense"] = best / r["step_ms"]
                    rows.append((name, phase, "cisa-step", "G=%d" % r["G"], r["step_ms"], best / r["step_ms"]))
            for r in cisa["results"]:  # decode with selection reuse: per-step average over r steps
                if r["method"] == "cisa-reuse" and r["geometry"] == name and r["phase"] == phase:
                    r["ratio_vs_best_dense"] = best / r["busy_ms"]
                    r["best_dense"] = best_name
                    rows.append((name, phase, "cisa-reuse", "r=%d" % r["reuse_steps"], r["busy_ms"],
                                 best / r["busy_ms"]))
                    if "step_ms" in r:  # the fresh and kept steps replayed as CUDA graphs
                        r["step_ratio_vs_best_dense"] = best / r["step_ms"]
                        rows.append((name, phase, "cisa-reuse-step", "r=%d" % r["reuse_steps"],
                                     r["step_ms"], best / r["step_ms"]))
            for a in out["anchors"]:
                if a["geometry"] == name and a["phase"] == phase and a["method"] not in ("cudnn", "flash") and "ms" in a:
                    a["ratio_vs_best_dense"] = best / a["ms"]
                    rows.append((name, phase, a["method"], "G=%s" % a.get("G", "-"), a["ms"], best / a["ms"]))
    out["table"] = rows
    json.dump(out, open(args.out, "w"), indent=1)
    print("\n%-5s %-7s %-14s %-5s %10s %8s | %9s %8s %8s %8s %8s %7s %8s" %
          ("geom", "phase", "method", "G", "busy ms", "x best", "attn", "score", "topk", "setup", "other", "TB/s", "TFLOP/s"))
    for r in rows:
        head = "%-5s %-7s %-14s %-5s %10.3f %8.2f" % r[:6]
        tail = " | %9.3f %8.3f %8.3f %8.3f %8.3f %7.2f %8.1f" % r[6:] if len(r) > 6 else ""
        print(head + tail)
    print("ceilings: copy %.2f TB/s, bf16 matmul %.0f TFLOP/s" % (out["ceilings"]["copy_tb_s"],
                                                                  out["ceilings"]["matmul_tflop_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
