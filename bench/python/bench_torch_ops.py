#!/usr/bin/env python3
"""The cisa ops through PyTorch on the GPU against `cisa bench layer`, FlexAttention block-sparse,
gather-then-SDPA, and the transformers backend's decode tokens/s (issue 16's benchmark).

Run on the GPU machine, after `cisa bench layer --backend cuda --json > layer.json` in the same
session (bench/scripts/gpu_python_bench.sh does everything):

    python3 bench/python/bench_torch_ops.py --cisa-json layer.json --commit abc1234 \
        --out torch_ops.json

Parts (each in try/except, or a subprocess with a timeout: a failure is recorded in the JSON and
the other parts still run):
  (a) ours: one layer at --context tokens (default 1,048,576), d = 128, bf16, the layer
      benchmark's geometries (4:1 x 16, 32:1 x 32, 32:2 x 16 sequences; decode, and terminal
      prefill of 512 queries with its G values), block tables a random permutation of the pool,
      representatives of every page, index queries base + 0.3 noise per position (as `cisa bench
      layer`). SparseAttentionWrapper(device="cuda") planned once, then `run` (selection and
      attention) timed with CUDA events: per call (median of --iters, events around one call, as
      `cisa bench layer` times each stage), pipelined (--iters calls back to back / --iters) and
      replays of a CUDA graph of one run (median). Compared with `cisa bench layer`'s GPU-busy
      time of the same case (setup + scoring + top-k + attention, i.e. without its amortised
      representative update "other"). The dense plan through the wrapper is timed too.
  (b) FlexAttention block-sparse at the same budget: a BlockMask built from CISA's own page lists
      of that case (16-token KV blocks, one query block per QShare group; the group's own pages
      causal through mask_mod, the rest full blocks), compiled flex_attention on contiguous K/V
      of the same shape; 16-token blocks first, then larger ones if the kernel refuses them
      (recorded). In a subprocess per case (compilation time and failures stay there).
  (c) gather-then-SDPA: the selected pages of every list gathered from the paged pool
      (index_select by page ID) into contiguous K/V, then SDPA; lists cut to the shortest list of
      the case (recorded), no causal mask inside the group's own page. Gather and SDPA timed
      together.
  (d) the transformers backend: a Llama-3.2-1B-shape model (hidden 2048, 32:8 heads, head_dim
      64, rope theta 500000, vocabulary 128256, --model-layers layers), random weights, bf16,
      batch 1: prefill of the context, then --model-tokens greedy decode steps timed, with SDPA
      and with CISA (k = --model-budget chunks, W = --model-window pages, G = 16), transformers'
      DynamicCache in both, and CISA again with cisa.transformers.Cache (no second copy of K/V).
      A subprocess per (attention, context).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import torch
import torch.nn.functional as F

from anchors_layer import median_ms  # bench/python: this script's own folder

D = 128
PAGE = 16
PREFILL = 512
GEOS = {"4:1": (4, 1, 16, [4, 16, 32]), "32:1": (32, 1, 32, [4]), "32:2": (32, 2, 16, [4])}


def err_text(e):
    return (f"{type(e).__name__}: {e}".split("\n")[0])[:300]


def run_child(argv, timeout):
    """Runs this script again with ``argv`` (one case in its own process, so a crash or a hang
    costs only that case) and returns the last JSON line it printed, or {"error": why}."""
    try:
        p = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True,
                           timeout=timeout)
        lines = [ln for ln in p.stdout.strip().splitlines() if ln.startswith("{")]
        if lines:
            return json.loads(lines[-1])
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    except Exception as e:  # noqa: BLE001
        return {"error": err_text(e)}


# ---- timing ---------------------------------------------------------------------------------

def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def per_call_ms(fn, iters, warmup=3):
    """CUDA events around each call, the median: the layer anchors' own timing."""
    return median_ms(fn, iters, warmup)


def pipelined_ms(fn, iters):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def graph_ms(fn, iters):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return per_call_ms(g.replay, iters), g


# ---- (a) ours, (c) gather-then-SDPA ---------------------------------------------------------

def cisa_rows(path):
    if not path or not os.path.exists(path):
        return None, []
    doc = json.load(open(path))
    return doc, doc.get("results", [])


def find_cisa(rows, geo, phase, method, G=None):
    for r in rows:
        if (r.get("geometry") == geo and r.get("phase") == phase and r.get("method") == method
                and (G is None or r.get("G") == G)):
            return r
    return None


def gather_sdpa(k, v, q, lists, hq, hkv, max_gib=24.0):
    """Gather each list's pages (physical IDs) from the pool into contiguous K/V, then SDPA of the
    group's rows x query heads of the list's KV group (one head, no mask). Returns (run, shortest
    list, longest list); run() gives the output as [rows, hq, D]."""
    groups, offsets, pages = lists["groups"], lists["offsets"], lists["pages"]
    ng = groups.shape[0]
    nl = ng * hkv
    lens = offsets[1:] - offsets[:-1]
    lmin, lmax = int(lens.min()), int(lens.max())
    gib = nl * lmin * PAGE * D * 2 * 2 / 2**30
    if gib > max_gib:
        raise ValueError(f"skipped: the gathered K/V would take {gib:.1f} GiB (limit {max_gib})")
    gs = groups[:, 2] - groups[:, 1] + 1
    if not bool((gs == gs[0]).all()):
        raise ValueError("groups of different sizes")
    gs = int(gs[0])
    hg = hq // hkv
    idx = pages[(offsets[:-1, None] + torch.arange(lmin)[None, :])].long()  # [nl, lmin]
    head = (torch.arange(nl) % hkv)[:, None]
    flat = (idx * hkv + head).reshape(-1).to(k.device)
    # q rows are packed group after group: [ng, gs, hkv, hg, D] -> [nl, 1, hg * gs, D]
    qq = (q.view(ng, gs, hkv, hg, D).permute(0, 2, 3, 1, 4).reshape(nl, 1, hg * gs, D)
          .contiguous())
    kf = k.view(-1, PAGE * D)
    vf = v.view(-1, PAGE * D)

    def run():
        kk = kf.index_select(0, flat).view(nl, 1, lmin * PAGE, D)
        vv = vf.index_select(0, flat).view(nl, 1, lmin * PAGE, D)
        o = F.scaled_dot_product_attention(qq, kk, vv)
        return o.view(ng, hkv, hg, gs, D).permute(0, 3, 1, 2, 4).reshape(ng * gs, hq, D)

    return run, lmin, lmax


def part_ours(args, out, tmpdir, cisa_results):
    import cisa
    N = args.context
    pps = N // PAGE
    geos = [g for g in args.geometries.split(",") if g]
    phases = [p for p in args.phases.split(",") if p]
    max_ph = max(GEOS[g][2] * pps * GEOS[g][1] for g in geos)
    kpool = torch.empty(max_ph * PAGE * D, dtype=torch.bfloat16, device="cuda").normal_()
    vpool = torch.empty_like(kpool).normal_()
    flex_jobs = []
    for geo in geos:
        hq, hkv, seqs, gvals = GEOS[geo]
        P = seqs * pps
        k = kpool[: P * hkv * PAGE * D].view(P, hkv, PAGE, D)
        v = vpool[: P * hkv * PAGE * D].view(P, hkv, PAGE, D)
        reps = torch.empty(P, hkv, D, dtype=torch.bfloat16, device="cuda")
        cisa.update_representatives(reps, k, torch.arange(P, dtype=torch.int32, device="cuda"))
        gen = torch.Generator().manual_seed(42)
        tables = torch.randperm(P, generator=gen).to(torch.int32).view(seqs, pps).contiguous()
        seq_lens = torch.full((seqs,), N, dtype=torch.int64)
        for phase in phases:
            count = PREFILL if phase == "prefill" else 1
            entries = torch.tensor([[s, N - count, count] for s in range(seqs)], dtype=torch.int64)
            rows = seqs * count
            base = torch.randn(seqs, 1, hkv, D, generator=gen)
            iq = (base + 0.3 * torch.randn(seqs, count, hkv, D, generator=gen)).reshape(
                rows, hkv, D).cuda()
            q = torch.randn(rows, hq, D, generator=gen).to(torch.bfloat16).cuda()
            cases = [("dense", 0)] if phase == "decode" else []
            cases += [("cisa", G) for G in (gvals if phase == "prefill" else [1])]
            for method, G in cases:
                rec = dict(part="ours", geometry=geo, seqs=seqs, phase=phase, method=method,
                           context=N)
                if method == "cisa":
                    rec.update(G=G, budget=args.budget, window=args.window)
                try:
                    w = cisa.SparseAttentionWrapper(num_kv_heads=hkv, device="cuda")
                    t0 = time.perf_counter()
                    w.plan(tables, seq_lens, entries, num_pages=P, dense=method == "dense",
                           budget=args.budget, window=args.window, qshare=max(G, 1),
                           k_cache=k, v_cache=v, reps=reps, num_q_heads=hq)
                    torch.cuda.synchronize()
                    rec["host_plan_ms"] = (time.perf_counter() - t0) * 1e3

                    def fn():
                        w.run(q, k, v, reps, iq)

                    rec["per_call_ms"] = per_call_ms(fn, args.iters)
                    rec["pipelined_ms"] = pipelined_ms(fn, args.iters)
                    rec["graph_ms"], g = graph_ms(fn, args.iters)
                    del g
                    ref = find_cisa(cisa_results, geo, phase, method,
                                    G if method == "cisa" else None)
                    if ref is not None:
                        busy = ref["busy_ms"] - ref.get("other_ms", 0.0)
                        rec["cisa_bench_busy_ms"] = ref["busy_ms"]
                        rec["cisa_bench_busy_without_reps_ms"] = busy
                        for kind in ("per_call", "pipelined", "graph"):
                            rec[f"{kind}_over_cisa_bench"] = rec[f"{kind}_ms"] / busy
                    if method == "cisa" and (phase == "decode" or G in (16, 32)):
                        lists = w.cuda_lists()
                        rec["list_pages"] = int(lists["pages"].numel())
                        rec["lists"] = int(lists["offsets"].numel() - 1)
                        path = os.path.join(tmpdir, f"{geo.replace(':', 'x')}_{phase}_G{G}.pt")
                        torch.save(dict(lists, geometry=geo, phase=phase, G=G, context=N), path)
                        try:
                            run, lmin, lmax = gather_sdpa(k, v, q, lists, hq, hkv,
                                                          args.gather_max_gib)
                            t = per_call_ms(run, args.iters)
                            del run
                            grec = dict(part="gather+sdpa", geometry=geo, seqs=seqs, phase=phase,
                                        G=G, ms=t, pages_per_list=lmin,
                                        longest_list=lmax,
                                        note="lists cut to the shortest; no causal mask in "
                                             "the group's own page")
                            grec["ratio_anchor_over_ours_graph"] = t / rec["graph_ms"]
                        except Exception as e:  # noqa: BLE001
                            grec = dict(part="gather+sdpa", geometry=geo, seqs=seqs, phase=phase,
                                        G=G, error=err_text(e))
                        out["results"].append(grec)
                        print(json.dumps(grec), flush=True)
                        if phase == "decode" or G in (16, 32):
                            flex_jobs.append((path, geo, seqs, phase, G, rec))
                    del w
                except Exception as e:  # noqa: BLE001
                    rec["error"] = err_text(e)
                    traceback.print_exc()
                out["results"].append(rec)
                print(json.dumps(rec), flush=True)
            del q, iq
        del reps, k, v
        torch.cuda.empty_cache()
    del kpool, vpool
    torch.cuda.empty_cache()
    return flex_jobs


# ---- (b) FlexAttention block-sparse ---------------------------------------------------------

def block_mask_from_lists(lists, hq, hkv, seqs, N, lq, G, kv_block=16, device="cuda"):
    """A BlockMask of CISA's lists: query block = one QShare group (G rows; 1 row in decode),
    KV blocks of kv_block tokens holding the list's pages. Blocks at or after the group's first
    position are partial (causal mask_mod), the others full."""
    from torch.nn.attention.flex_attention import BlockMask
    groups, offsets, chunks = lists["groups"], lists["offsets"], lists["chunks"]
    per = kv_block // PAGE
    nkv = N // kv_block
    q_block = max(G, 1) if lq > 1 else 128  # decode: one query block holding the one row
    nq = -(-lq // q_block)
    hg = hq // hkv
    full_idx = torch.zeros(seqs, hq, nq, nkv, dtype=torch.int32)
    full_num = torch.zeros(seqs, hq, nq, dtype=torch.int32)
    part_idx = torch.zeros(seqs, hq, nq, nkv, dtype=torch.int32)
    part_num = torch.zeros(seqs, hq, nq, dtype=torch.int32)
    tokens = 0
    for i, (e, first, last, _row, _dense) in enumerate(groups.tolist()):
        qb = (first - (N - lq)) // q_block
        for g in range(hkv):
            lo, hi = int(offsets[i * hkv + g]), int(offsets[i * hkv + g + 1])
            blocks = torch.unique(chunks[lo:hi].long() // per)
            own = first // kv_block
            full = blocks[blocks < own]
            part = blocks[blocks >= own]
            tokens += blocks.numel() * kv_block
            for h in range(g * hg, (g + 1) * hg):
                full_idx[e, h, qb, : full.numel()] = full.to(torch.int32)
                full_num[e, h, qb] = full.numel()
                part_idx[e, h, qb, : part.numel()] = part.to(torch.int32)
                part_num[e, h, qb] = part.numel()
    off = N - lq

    def causal(b, h, q_idx, kv_idx):
        return q_idx + off >= kv_idx

    dev = torch.device(device)
    kw = dict(BLOCK_SIZE=(q_block, kv_block), mask_mod=causal, seq_lengths=(lq, N))
    blocks = (part_num.to(dev), part_idx.to(dev), full_num.to(dev), full_idx.to(dev))
    try:
        bm = BlockMask.from_kv_blocks(*blocks, compute_q_blocks=False, **kw)  # forward only
    except TypeError:
        bm = BlockMask.from_kv_blocks(*blocks, **kw)
    return bm, tokens / max(1, groups.shape[0] * hkv)


def flex_case(path, iters):
    """Subprocess entry: FlexAttention on one case's lists; prints one JSON line."""
    from torch.nn.attention.flex_attention import flex_attention
    lists = torch.load(path)
    geo, phase, G, N = lists["geometry"], lists["phase"], lists["G"], lists["context"]
    hq, hkv, seqs, _ = GEOS[geo]
    lq = PREFILL if phase == "prefill" else 1
    torch.manual_seed(0)
    k = torch.randn(seqs, hkv, N, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    q = torch.randn(seqs, hq, lq, D, dtype=torch.bfloat16, device="cuda")
    fn = torch.compile(flex_attention, dynamic=False)
    tries = []
    for kv_block in (16, 32, 64, 128):
        try:
            bm, tokens = block_mask_from_lists(lists, hq, hkv, seqs, N, lq, G, kv_block)
        except Exception as e:  # noqa: BLE001
            tries.append(dict(kv_block=kv_block, error="mask: " + err_text(e)))
            continue
        bn = min(kv_block, 64)
        opts = [None, {"BLOCK_N": bn}, {"BLOCK_M": 16, "BLOCK_N": bn}]
        for o in opts:
            try:
                run = (lambda: fn(q, k, v, block_mask=bm, enable_gqa=True)) if o is None else (
                    lambda: fn(q, k, v, block_mask=bm, enable_gqa=True, kernel_options=o))
                t0 = time.perf_counter()
                run()
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - t0
                ms = per_call_ms(run, iters)
                print(json.dumps(dict(ms=ms, kv_block=kv_block, q_block=max(G, 1) if lq > 1
                                      else 128, kernel_options=o, tokens_per_list=tokens,
                                      compile_s=compile_s, failed_tries=tries)), flush=True)
                return 0
            except Exception as e:  # noqa: BLE001
                tries.append(dict(kv_block=kv_block, kernel_options=o, error=err_text(e)))
    print(json.dumps(dict(error="no block size ran", failed_tries=tries)), flush=True)
    return 1


def part_flex(args, out, jobs, deadline):
    # Most wanted first (the deadline may cut the rest): 4:1 decode, 4:1 prefill G = 32 (the
    # layer benchmark's FlexAttention case), the other decodes, then G = 16.
    order = {("4:1", "decode", 1): 0, ("4:1", "prefill", 32): 1, ("32:2", "decode", 1): 2,
             ("32:1", "decode", 1): 3, ("4:1", "prefill", 16): 4}
    jobs = sorted(jobs, key=lambda j: order.get((j[1], j[3], j[4]), 9))
    for path, geo, seqs, phase, G, ours in jobs:
        rec = dict(part="flex", geometry=geo, seqs=seqs, phase=phase, G=G)
        left = deadline - time.time()
        if left < 30:
            rec["error"] = "skipped: no time left"
        else:
            rec.update(run_child(["--flex-case", path, "--iters", str(args.iters)],
                                 min(args.flex_timeout, left - 10)))
        if "ms" in rec and "graph_ms" in ours:
            rec["ratio_anchor_over_ours_graph"] = rec["ms"] / ours["graph_ms"]
        out["results"].append(rec)
        print(json.dumps(rec), flush=True)


# ---- (d) the transformers backend: decode tokens/s ------------------------------------------

def model_case(impl, context, layers, tokens, budget, window):
    """Subprocess entry: one model, one attention, one context; prints one JSON line. impl:
    "sdpa" (PyTorch picks the kernel), "sdpa_no_cudnn" (SDPA with cuDNN attention left out:
    FlashAttention, memory-efficient or math), "cisa_bench" (CISA beside transformers'
    DynamicCache), "cisa_cache" (CISA with cisa.transformers.Cache: no second copy of K/V)."""
    import contextlib
    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import cisa.transformers as ct
    ct.register("cisa_bench", budget=budget, window=window, qshare=16)
    cfg = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, rope_theta=500000.0,
        max_position_embeddings=131072, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        try:
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, attn_implementation="sdpa", dtype=torch.bfloat16)
        except TypeError:
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    model.set_attn_implementation("sdpa" if impl.startswith("sdpa") else "cisa_bench")
    ctx = (sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH]) if impl == "sdpa_no_cudnn" else contextlib.nullcontext())
    init_s = time.perf_counter() - t0
    ids = torch.randint(0, cfg.vocab_size, (1, context), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))
    with torch.no_grad(), ctx:
        cache = ct.Cache(model) if impl == "cisa_cache" else transformers.DynamicCache()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        prefill_s = time.perf_counter() - t0
        toks = []
        for i in range(tokens + 2):
            if i == 2:  # two untimed steps first
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            out = model(nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            toks.append(nxt)
        torch.cuda.synchronize()
        decode_s = time.perf_counter() - t0
    rec = dict(tokens_per_s=tokens / decode_s, ms_per_token=decode_s / tokens * 1e3,
               prefill_s=prefill_s, init_s=init_s, decode_tokens=tokens,
               max_memory_gib=torch.cuda.max_memory_allocated() / 2**30,
               first_tokens=torch.cat(toks[:8], 1).view(-1).tolist())
    if impl.startswith("cisa"):
        read, dense = ct.stats(model)
        rec.update(pages_read=read, pages_read_dense=dense)
    print(json.dumps(rec), flush=True)
    return 0


def part_model(args, out, deadline):
    for context in [int(c) for c in args.model_contexts.split(",") if c]:
        recs = {}
        for impl in args.model_impls.split(","):
            rec = dict(part="model", model="llama-3.2-1b shape, random weights, bf16",
                       layers=args.model_layers, context=context, batch=1,
                       attention="cisa" if impl.startswith("cisa") else impl,
                       cache="cisa.transformers.Cache" if impl == "cisa_cache"
                       else "transformers DynamicCache")
            if impl.startswith("cisa"):
                rec.update(budget=args.model_budget, window=args.model_window, qshare=16)
            left = deadline - time.time()
            if left < 20:
                rec["error"] = "skipped: no time left"
            else:
                rec.update(run_child(
                    ["--model-case", f"{impl},{context},{args.model_layers},{args.model_tokens},"
                     f"{args.model_budget},{args.model_window}"],
                    min(args.model_timeout, left - 5)))
            recs[impl] = rec
            out["results"].append(rec)
            print(json.dumps(rec), flush=True)
        for ours in ("cisa_bench", "cisa_cache"):
            c = recs.get(ours, {})
            for name in ("sdpa", "sdpa_no_cudnn"):
                if "tokens_per_s" in c and "tokens_per_s" in recs.get(name, {}):
                    c[f"speedup_vs_{name}"] = c["tokens_per_s"] / recs[name]["tokens_per_s"]


# ---- report ---------------------------------------------------------------------------------

def table(out):
    lines = []
    ours = [r for r in out["results"] if r.get("part") == "ours"]
    lines.append("%-5s %-7s %-6s %4s | %9s %9s %9s | %9s %7s | %9s %7s | %9s %7s" % (
        "geom", "phase", "method", "G", "per-call", "pipelined", "graph", "cisa bench",
        "graph/cb", "flex", "flex/us", "gather", "gath/us"))
    for r in ours:
        if "error" in r:
            lines.append(f"{r['geometry']:5} {r['phase']:7} {r['method']:6} {r.get('G', '-')!s:>4}"
                         f" | error: {r['error']}")
            continue

        def anchor(part):
            for a in out["results"]:
                if (a.get("part") == part and a["geometry"] == r["geometry"]
                        and a["phase"] == r["phase"] and a.get("G") == r.get("G")
                        and r["method"] == "cisa"):
                    return a
            return None

        f, g = anchor("flex"), anchor("gather+sdpa")
        cb = r.get("cisa_bench_busy_without_reps_ms")

        def fmt(x, spec="%9.3f"):
            return spec % x if isinstance(x, (int, float)) else "%9s" % "-"

        lines.append("%-5s %-7s %-6s %4s | %s %s %s | %s %7s | %s %7s | %s %7s" % (
            r["geometry"], r["phase"], r["method"], r.get("G", "-"), fmt(r["per_call_ms"]),
            fmt(r["pipelined_ms"]), fmt(r["graph_ms"]), fmt(cb),
            "%.3f" % (r["graph_ms"] / cb) if cb else "-",
            fmt(f.get("ms") if f else None),
            "%.2f" % (f["ms"] / r["graph_ms"]) if f and "ms" in f else "-",
            fmt(g.get("ms") if g else None),
            "%.2f" % (g["ms"] / r["graph_ms"]) if g and "ms" in g else "-"))
    for r in out["results"]:
        if r.get("part") == "model":
            if "error" in r:
                lines.append(f"model {r['attention']:5} {r['context']:7d}: error {r['error']}")
            else:
                sp = "".join(", %.2fx %s" % (r[f"speedup_vs_{n}"], n)
                             for n in ("sdpa", "sdpa_no_cudnn") if f"speedup_vs_{n}" in r)
                lines.append("model %-13s context %7d, %d layers: %.1f tokens/s (%.2f ms/token, "
                             "prefill %.2f s)%s" % (r["attention"], r["context"], r["layers"],
                                                    r["tokens_per_s"], r["ms_per_token"],
                                                    r["prefill_s"], sp))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cisa-json", help="`cisa bench layer --backend cuda --json` of this session")
    ap.add_argument("--out", default="torch_ops.json")
    ap.add_argument("--commit", default=os.environ.get("CISA_COMMIT", "unknown"))
    ap.add_argument("--context", type=int, default=1048576)
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--geometries", default="4:1,32:1,32:2")
    ap.add_argument("--phases", default="decode,prefill")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--parts", default="ours,flex,model")
    ap.add_argument("--flex-timeout", type=float, default=150)
    ap.add_argument("--gather-max-gib", type=float, default=24.0)
    ap.add_argument("--model-contexts", default="32768,131072")
    ap.add_argument("--model-layers", type=int, default=16)
    ap.add_argument("--model-tokens", type=int, default=32)
    ap.add_argument("--model-budget", type=int, default=512)
    ap.add_argument("--model-window", type=int, default=128)
    ap.add_argument("--model-timeout", type=float, default=150)
    ap.add_argument("--model-impls", default="sdpa,sdpa_no_cudnn,cisa_bench,cisa_cache",
                    help="sdpa (PyTorch's choice), sdpa_no_cudnn (SDPA without cuDNN "
                         "attention), cisa_bench")
    ap.add_argument("--time-limit", type=float, default=300, help="seconds for the whole run")
    ap.add_argument("--flex-case", help=argparse.SUPPRESS)
    ap.add_argument("--model-case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.flex_case:
        return flex_case(args.flex_case, args.iters)
    if args.model_case:
        impl, c, layers, tokens, budget, window = args.model_case.split(",")
        return model_case(impl, int(c), int(layers), int(tokens), int(budget), int(window))

    deadline = time.time() + args.time_limit
    import cisa
    try:
        import transformers
        tv = transformers.__version__
    except Exception:  # noqa: BLE001
        tv = None
    drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    cdoc, crows = cisa_rows(args.cisa_json)
    out = dict(
        gpu=torch.cuda.get_device_name(), driver=drv, torch=torch.__version__,
        cuda=torch.version.cuda, transformers=tv, cisa_has_cuda=cisa.HAS_CUDA,
        commit=args.commit,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command="python3 " + " ".join(sys.argv), args=vars(args),
        cisa_bench_layer=cdoc, results=[], errors=[])
    parts = args.parts.split(",")
    tmpdir = tempfile.mkdtemp(prefix="cisa_torch_ops_")
    jobs = []

    def save():
        json.dump(out, open(args.out, "w"), indent=1)

    if "ours" in parts:
        try:
            jobs = part_ours(args, out, tmpdir, crows)
        except Exception as e:  # noqa: BLE001
            out["errors"].append("ours: " + err_text(e))
            traceback.print_exc()
        save()
    if "model" in parts:
        # Before flex (whose compilations take long): the model's tokens/s must not be lost.
        try:
            part_model(args, out, deadline)
        except Exception as e:  # noqa: BLE001
            out["errors"].append("model: " + err_text(e))
        save()
    if "flex" in parts and jobs:
        try:
            part_flex(args, out, jobs, deadline)
        except Exception as e:  # noqa: BLE001
            out["errors"].append("flex: " + err_text(e))
        save()
    out["table"] = table(out)
    save()
    print("\n" + out["table"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
