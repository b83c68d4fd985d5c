"""GPU checks: they skip, saying why, without a CUDA device."""

import math

import pytest
import torch

import cisa
from helpers import entries_tensor, make_cache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device (torch.cuda.is_available() is False)")


@pytest.mark.skipif(cisa.HAS_CUDA, reason="this build has the CUDA backend")
def test_cuda_tensors_without_cuda_build_raise_clearly():
    c = make_cache([40], num_kv_heads=1, head_dim=32)
    w = cisa.SparseAttentionWrapper(num_kv_heads=1)
    w.plan(c["block_tables"], c["seq_lens"], entries_tensor([(0, 39, 1)]),
           num_pages=c["num_pages"], dense=True)
    q = torch.randn(1, 1, 32, device="cuda")
    with pytest.raises(RuntimeError, match="built without CUDA"):
        w.run(q, c["k_cache"].cuda(), c["v_cache"].cuda())


cuda_build = pytest.mark.skipif(not cisa.HAS_CUDA,
                                reason="this cisa build has no CUDA backend (-DCISA_PY_CUDA=ON)")
H, HQ, D = 2, 8, 128


def cuda_case(lens, seed=0):
    c = make_cache(lens, num_kv_heads=H, head_dim=D, dtype=torch.bfloat16, seed=seed)
    full = torch.cat([c["block_tables"][s, : n // 16] for s, n in enumerate(lens)])
    reps = torch.zeros(c["num_pages"], H, D, dtype=torch.bfloat16)
    cisa.update_representatives(reps, c["k_cache"], full)
    return c, reps, full


@cuda_build
def test_cuda_representatives_match_cpu():
    c, reps, full = cuda_case([700, 300])
    dreps = torch.zeros_like(reps).cuda()
    cisa.update_representatives(dreps, c["k_cache"].cuda(), full.cuda())
    torch.testing.assert_close(dreps.cpu()[full.long()].float(), reps[full.long()].float(),
                               rtol=1e-2, atol=1e-2)


@cuda_build
@pytest.mark.parametrize("dense", [False, True])
def test_cuda_plan_run_matches_cpu(dense):
    lens = [3000, 1200]
    ent = [(0, 2900, 100), (1, 1199, 1)]
    c, reps, _ = cuda_case(lens, seed=1)
    rows = 101
    g = torch.Generator().manual_seed(2)
    q = torch.randn(rows, HQ, D, generator=g).bfloat16()
    iq = torch.randn(rows, H, D, generator=g)
    params = dict(dense=dense, budget=16, window=4, qshare=16)
    cpu = cisa.SparseAttentionWrapper(num_kv_heads=H)
    cpu.plan(c["block_tables"], c["seq_lens"], entries_tensor(ent), num_pages=c["num_pages"],
             **params)
    out_cpu, lse_cpu = cpu.run(q.float(), c["k_cache"], c["v_cache"], reps, iq)
    k, v, r = c["k_cache"].cuda(), c["v_cache"].cuda(), reps.cuda()
    gpu = cisa.SparseAttentionWrapper(num_kv_heads=H, device="cuda")
    gpu.plan(c["block_tables"], c["seq_lens"], entries_tensor(ent), num_pages=c["num_pages"],
             k_cache=k, v_cache=v, reps=r, num_q_heads=HQ, **params)
    out, lse = gpu.run(q.cuda(), k, v, r, iq.cuda())
    torch.cuda.synchronize()
    pages, chunks, read = gpu.cuda_page_lists()
    assert torch.equal(chunks, cpu.chunks) and torch.equal(pages, cpu.pages)
    assert read > 0  # K/V pages its attention tiles read (each row tile reads its pages)
    torch.testing.assert_close(out.cpu(), out_cpu, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse.cpu(), lse_cpu, rtol=1e-3, atol=1e-3)


@cuda_build
def test_cuda_run_replays_in_a_cuda_graph():
    lens = [2000]
    ent = [(0, 1999, 1)]
    c, reps, _ = cuda_case(lens, seed=3)
    k, v, r = c["k_cache"].cuda(), c["v_cache"].cuda(), reps.cuda()
    w = cisa.SparseAttentionWrapper(num_kv_heads=H, device="cuda")
    w.plan(c["block_tables"], c["seq_lens"], entries_tensor(ent), num_pages=c["num_pages"],
           k_cache=k, v_cache=v, reps=r, num_q_heads=HQ, budget=8, window=2)
    q = torch.randn(1, HQ, D, device="cuda").bfloat16()
    iq = torch.randn(1, H, D, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        w.run(q, k, v, r, iq)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    eager = w.out.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, k, v, r, iq)
    w.out.zero_()
    q2 = torch.randn_like(q)
    q.copy_(q2)
    graph.replay()
    torch.cuda.synchronize()
    want, _ = cisa.SparseAttentionWrapper(num_kv_heads=H, device="cuda"), None
    want.plan(c["block_tables"], c["seq_lens"], entries_tensor(ent), num_pages=c["num_pages"],
              k_cache=k, v_cache=v, reps=r, num_q_heads=HQ, budget=8, window=2)
    ref, _ = want.run(q, k, v, r, iq)
    torch.cuda.synchronize()
    assert not torch.equal(eager, ref)
    torch.testing.assert_close(w.out, ref, rtol=0, atol=0)


# ---- the individual ops on CUDA tensors against the same ops on the CPU ----------------------
# Random bf16 caches, several sequences of different lengths, GQA 8:2. What is exact and what is
# within a tolerance follows docs/cuda.md: representatives, index queries and the top-k order are
# bit-identical to the CPU engine; scores are f32 sums in another order (the f32 rounding bound
# below); attention runs bf16 tensor cores with f32 accumulation (out within 2e-2, lse 1e-3).

def cuda_case_hd(lens, num_kv_heads, head_dim, seed=0, rep_kind="mean"):
    c = make_cache(lens, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=torch.bfloat16,
                   seed=seed)
    full = torch.cat([c["block_tables"][s, : n // 16] for s, n in enumerate(lens)])
    reps = torch.zeros(c["num_pages"], num_kv_heads, cisa.rep_width(rep_kind, head_dim),
                       dtype=torch.bfloat16)
    cisa.update_representatives(reps, c["k_cache"], full, rep_kind)
    c["full"] = full
    return c, reps


def score_tolerance(q, reps, pages):
    """Bound on |GPU - CPU| of q[g] . reps[p, g] / sqrt(d): two f32 sums of d products in
    different orders each err by at most d * 2^-24 * sum |q_i r_i|."""
    d = q.shape[-1]
    r = reps[pages.long()].float().abs().permute(1, 0, 2)  # [H, n, d]
    mag = (q.abs()[:, None, :] * r).sum(-1)
    return 2 * d * 2.0 ** -24 * mag / math.sqrt(d) + 1e-30


@cuda_build
@pytest.mark.parametrize("d", [64, 128, 256])
def test_cuda_chunk_scores_match_cpu(d):
    lens = [900, 400]
    c, reps = cuda_case_hd(lens, H, d, seed=4)
    q = torch.randn(H, d, generator=torch.Generator().manual_seed(5))
    dq, dreps = q.cuda(), reps.cuda()
    for s, first, n in [(0, 0, 56), (0, 3, 1), (0, 40, 16), (1, 2, 20), (1, 0, 25), (0, 10, 0)]:
        table = c["block_tables"][s].contiguous()
        want = cisa.chunk_scores(q, reps, table, first, n)
        got = cisa.chunk_scores(dq, dreps, table, first, n)
        assert got.device == dq.device and got.dtype == torch.float32
        assert got.shape == want.shape == (H, n)
        tol = score_tolerance(q, reps, table[first:first + n])
        err = (got.cpu() - want).abs()
        assert (err <= tol).all(), f"chunks [{first}, {first + n}) of sequence {s}: " \
                                   f"max error {err.max()} over tolerance"


@cuda_build
def test_cuda_topk_matches_cpu_bit_exactly():
    g = torch.Generator().manual_seed(6)
    s = torch.randn(6, 300, generator=g)
    s[0, ::7] = 0.5                     # ties, broken toward the smaller index
    s[1, :50] = float("nan")            # NaN ranks below every number
    s[2] = 1.0                          # all equal
    s[3, 10], s[3, 20] = float("inf"), -float("inf")
    s[4] = torch.round(s[4] * 2) / 2    # many ties, -0.0 among them (equal to +0.0)
    s[4, 0], s[4, 1] = -0.0, 0.0
    s[5, 100:] = float("nan")
    ds = s.cuda()
    for k in [0, 1, 7, 64, 250, 299, 300, 400]:
        want = cisa.topk(s, k)
        got = cisa.topk(ds, k)
        assert got.device == ds.device and got.dtype == torch.int32 and got.shape == want.shape
        assert torch.equal(got.cpu(), want), f"k = {k}"
    # Long rows: the clustered top-k (at most 64 lists of at least 16,384 scores) and many rows.
    big = torch.randn(3, 20000, generator=g)
    big[:, ::3] = 0.25
    many = torch.randn(200, 700, generator=g)
    for x, k in [(big, 100), (big, 5000), (many, 33)]:
        assert torch.equal(cisa.topk(x.cuda(), k).cpu(), cisa.topk(x, k)), f"k = {k}"
    assert cisa.topk(torch.empty(0, 5, device="cuda"), 3).shape == (0, 3)


SEL_LENS = [3000, 1200, 777]
# A prefill block deep in the sparse region, a decode row, and an entry straddling the dense
# prefix (positions 300 ... 776; the split is at (k + W + sinks + 1) * 16).
SEL_ENTRIES = [(0, 2900, 100), (1, 1199, 1), (2, 300, 477)]
SEL_PARAMS = [dict(budget=16, window=4, qshare=16, sink_pages=0, qshare_query="mean"),
              dict(budget=8, window=2, qshare=1, sink_pages=2, qshare_query="last"),
              dict(budget=12, window=3, qshare=5, sink_pages=1, qshare_query="mean")]


def sel_setup(d, seed, rep_kind="mean"):
    c, reps = cuda_case_hd(SEL_LENS, H, d, seed=seed, rep_kind=rep_kind)
    rows = sum(e[2] for e in SEL_ENTRIES)
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(rows, HQ, d, generator=g).bfloat16()
    iq = torch.randn(rows, H, d, generator=g)
    return c, reps, q, iq


def assert_selection_matches(cpu, gpu, plan_tensors, c, reps, iq, p, rep_kind="mean"):
    """num_selected exactly; chunks and pages list by list, where a difference is allowed only
    between chunks whose CPU scores are within f32 rounding of the k-th largest (a near-tie at the
    boundary: the GPU's scores are not bit-identical)."""
    groups, offsets = plan_tensors
    (pc, cc, nc), (pg, cg, ng) = cpu, gpu
    assert torch.equal(ng, nc)
    assert pg.shape == pc.shape and cg.shape == cc.shape
    swaps = 0
    for li in range(offsets.numel() - 1):
        a, b = int(offsets[li]), int(offsets[li + 1])
        gi, kv = divmod(li, H)
        e, first, last, row, dense = groups[gi].tolist()
        table = c["block_tables"][SEL_ENTRIES[e][0]]
        assert torch.equal(pg[a:b], table[cg[a:b].long()]), f"list {li}: pages are not its chunks'"
        if torch.equal(cg[a:b], cc[a:b]):
            continue
        assert not dense, f"dense list {li} differs"
        r1 = row + (last - first)
        r0 = r1 if p["qshare_query"] == "last" else row
        qbar = iq[r0:r1 + 1].mean(0)  # [H, d]
        e0, e1 = p["sink_pages"], first // 16 - p["window"]
        sc = cisa.chunk_scores(qbar, reps, table.contiguous(), e0, e1 - e0, rep_kind)[kv]
        kth = sc.sort(descending=True).values[p["budget"] - 1]
        diff = set(cg[a:b].tolist()) ^ set(cc[a:b].tolist())
        for ch in diff:
            assert abs(float(sc[ch - e0]) - float(kth)) <= 1e-4 * (1 + abs(float(kth))), \
                f"list {li}: chunk {ch} differs but is no near-tie at the k-th score"
        swaps += len(diff) // 2
    assert swaps <= 4, f"{swaps} near-tie swaps"


@cuda_build
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("pi", range(len(SEL_PARAMS)))
def test_cuda_select_pages_matches_cpu(d, pi):
    p = SEL_PARAMS[pi]
    c, reps, _, iq = sel_setup(d, seed=10 + pi)
    ent = entries_tensor(SEL_ENTRIES)
    groups, offsets, pages, _, num_selected = cisa.plan(
        c["block_tables"], c["seq_lens"], ent, num_pages=c["num_pages"], num_kv_heads=H, **p)
    args = (p["budget"], p["window"], p["qshare"], p["sink_pages"], p["qshare_query"] == "last",
            pages.numel(), num_selected.numel())
    cpu = cisa.select_pages(iq, c["k_cache"], reps, c["block_tables"], c["seq_lens"], ent, *args)
    gpu = cisa.select_pages(iq.cuda(), c["k_cache"].cuda(), reps.cuda(), c["block_tables"],
                            c["seq_lens"], ent, *args)
    for t in gpu:  # page lists are host tensors, as on the CPU
        assert t.device.type == "cpu" and t.dtype == torch.int32
    assert_selection_matches(cpu, gpu, (groups, offsets), c, reps, iq, p)


@cuda_build
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mode", ["dense", "sliding", "sparse"])
def test_cuda_paged_attention_matches_cpu(d, mode):
    c, reps, q, iq = sel_setup(d, seed=20)
    ent = entries_tensor(SEL_ENTRIES)
    k, v, r = c["k_cache"].cuda(), c["v_cache"].cuda(), reps.cuda()
    sw = 40 if mode == "sliding" else 0
    p = SEL_PARAMS[0]
    groups, offsets, pages, chunks, num_selected = cisa.plan(
        c["block_tables"], c["seq_lens"], ent, num_pages=c["num_pages"], num_kv_heads=H,
        dense=mode != "sparse", sliding_window=sw, **p)
    if mode == "sparse":
        pages, chunks, _ = cisa.select_pages(
            iq.cuda(), k, r, c["block_tables"], c["seq_lens"], ent, p["budget"], p["window"],
            p["qshare"], p["sink_pages"], False, pages.numel(), num_selected.numel())
    batch = (c["block_tables"], c["seq_lens"], ent, groups, offsets, pages, chunks)
    # The same lists on both: the CPU op attends the lists the GPU selected.
    out_cpu, lse_cpu = cisa.paged_attention(q.float(), c["k_cache"], c["v_cache"], *batch, 0.0, sw)
    out, lse = cisa.paged_attention(q.cuda(), k, v, *batch, 0.0, sw)
    assert out.device == k.device and out.dtype == torch.float32 and out.shape == q.shape
    assert lse.device == k.device and lse.dtype == torch.float32 and lse.shape == q.shape[:2]
    torch.testing.assert_close(out.cpu(), out_cpu, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse.cpu(), lse_cpu, rtol=1e-3, atol=1e-3)
    if mode == "dense":  # an explicit scale
        out2, _ = cisa.paged_attention(q.cuda(), k, v, *batch, 0.05, 0)
        want2, _ = cisa.paged_attention(q.float(), c["k_cache"], c["v_cache"], *batch, 0.05, 0)
        torch.testing.assert_close(out2.cpu(), want2, rtol=2e-2, atol=2e-2)


@cuda_build
def test_cuda_ops_trace_and_opcheck():
    c, reps, q, iq = sel_setup(128, seed=30)
    ent = entries_tensor(SEL_ENTRIES)
    k, v, r = c["k_cache"].cuda(), c["v_cache"].cuda(), reps.cuda()
    table = c["block_tables"][0].contiguous()
    torch.library.opcheck(torch.ops.cisa.topk.default, (torch.randn(3, 50, device="cuda"), 5))
    torch.library.opcheck(torch.ops.cisa.chunk_scores.default,
                          (torch.randn(H, 128, device="cuda"), r, table, 1, 30))
    groups, offsets, pages, chunks, num_selected = cisa.plan(
        c["block_tables"], c["seq_lens"], ent, num_pages=c["num_pages"], num_kv_heads=H,
        **SEL_PARAMS[0])
    sel = (iq.cuda(), k, r, c["block_tables"], c["seq_lens"], ent, 16, 4, 16, 0, False,
           pages.numel(), num_selected.numel())
    torch.library.opcheck(torch.ops.cisa.select_pages.default, sel)
    pages, chunks, _ = torch.ops.cisa.select_pages(*sel)
    att = (q.cuda(), k, v, c["block_tables"], c["seq_lens"], ent, groups, offsets, pages, chunks,
           0.0, 0)
    torch.library.opcheck(torch.ops.cisa.paged_attention.default, att)

    def step(q, index_q, k_cache, v_cache, reps, block_tables, seq_lens, entries, groups,
             offsets, total: int, lists: int):
        p, ch, _ = torch.ops.cisa.select_pages(index_q, k_cache, reps, block_tables, seq_lens,
                                               entries, 16, 4, 16, 0, False, total, lists)
        out, lse = torch.ops.cisa.paged_attention(q, k_cache, v_cache, block_tables, seq_lens,
                                                  entries, groups, offsets, p, ch, 0.0, 0)
        return out.sum(-1) * 2 + lse

    args = (q.cuda(), iq.cuda(), k, v, r, c["block_tables"], c["seq_lens"], ent, groups, offsets,
            pages.numel(), num_selected.numel())
    eager = step(*args)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(*args)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


@cuda_build
def test_cuda_ops_bad_inputs_raise_clearly():
    c, reps, q, iq = sel_setup(128, seed=40)
    ent = entries_tensor(SEL_ENTRIES)
    k, v, r = c["k_cache"].cuda(), c["v_cache"].cuda(), reps.cuda()
    P = c["num_pages"]
    p = SEL_PARAMS[0]
    groups, offsets, pages, chunks, num_selected = cisa.plan(
        c["block_tables"], c["seq_lens"], ent, num_pages=P, num_kv_heads=H, dense=True)
    batch = (c["block_tables"], c["seq_lens"], ent, groups, offsets, pages, chunks)
    sel_args = (p["budget"], p["window"], p["qshare"], 0, False, 0, 0)
    table = c["block_tables"][0].contiguous()
    # float32 caches: the backend reads bf16 only.
    with pytest.raises(TypeError, match=r"cisa.select_pages: on CUDA k_cache must be bfloat16"):
        cisa.select_pages(iq.cuda(), k.float(), r.float(), c["block_tables"], c["seq_lens"], ent,
                          *sel_args)
    with pytest.raises(TypeError, match=r"cisa.chunk_scores: on CUDA reps must be bfloat16"):
        cisa.chunk_scores(torch.randn(H, 128, device="cuda"), r.float(), table, 0, 4)
    with pytest.raises(TypeError, match=r"cisa.paged_attention: on CUDA k_cache must be bfloat16"):
        cisa.paged_attention(q.cuda(), k.float(), v.float(), *batch, 0.0, 0)
    with pytest.raises(TypeError, match=r"cisa.paged_attention: on CUDA q must be bfloat16"):
        cisa.paged_attention(q.float().cuda(), k, v, *batch, 0.0, 0)
    with pytest.raises(TypeError, match=r"cisa.topk: scores must be float32"):
        cisa.topk(torch.randn(2, 8, device="cuda").double(), 3)
    # Devices mixed.
    with pytest.raises(ValueError, match="one device"):
        cisa.paged_attention(q.cuda(), c["k_cache"], c["v_cache"], *batch, 0.0, 0)
    with pytest.raises(ValueError, match="one device"):
        cisa.chunk_scores(torch.randn(H, 128), r, table, 0, 4)
    with pytest.raises(ValueError, match="one device"):
        cisa.select_pages(iq, k, r, c["block_tables"], c["seq_lens"], ent, *sel_args)
    with pytest.raises(ValueError, match="block_tables must be on cpu"):
        cisa.select_pages(iq.cuda(), k, r, c["block_tables"].cuda(), c["seq_lens"], ent, *sel_args)
    # A head_dim the backend does not have.
    c32 = make_cache([100], num_kv_heads=H, head_dim=32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="on CUDA head_dim must be 64, 128 or 256"):
        cisa.chunk_scores(torch.randn(H, 32, device="cuda"),
                          torch.zeros(c32["num_pages"], H, 32, dtype=torch.bfloat16,
                                      device="cuda"), c32["block_tables"][0].contiguous(), 0, 2)
    with pytest.raises(ValueError, match="k must be >= 0"):
        cisa.topk(torch.randn(2, 8, device="cuda"), -1)
    # Page IDs out of range.
    bad = c["block_tables"].clone()
    bad[0, 3] = P + 7
    with pytest.raises(IndexError, match=r"block_tables row 0: .*page ID %d .*out of range" % (P + 7)):
        cisa.select_pages(iq.cuda(), k, r, bad, c["seq_lens"], ent, *sel_args)
    with pytest.raises(IndexError, match=r"page ID %d \(chunk 3\) is out of range" % (P + 7)):
        cisa.chunk_scores(torch.randn(H, 128, device="cuda"), r, bad[0].contiguous(), 0, 5)
    with pytest.raises(IndexError, match="out of range"):
        cisa.paged_attention(q.cuda(), k, v, bad, *batch[1:], 0.0, 0)
    badp = pages.clone()
    badp[2] = -5
    with pytest.raises(IndexError, match=r"page ID -5 \(entry 2 of the page lists\) is out of range"):
        cisa.paged_attention(q.cuda(), k, v, *batch[:5], badp, chunks, 0.0, 0)
    with pytest.raises(IndexError, match="not inside the block table"):
        cisa.chunk_scores(torch.randn(H, 128, device="cuda"), r, table, table.numel() - 5, 20)
    # Lists the backend did not plan: a valid page in the wrong place.
    other = pages.clone()
    other[0], other[1] = pages[1], pages[0]
    with pytest.raises(ValueError, match="attends only page lists it plans itself"):
        cisa.paged_attention(q.cuda(), k, v, *batch[:5], other, chunks, 0.0, 0)
    # Sparse lists selected elsewhere (by the CPU op; no CUDA selection of this batch was made)
    # are refused too: the backend cannot attend lists it did not select.
    sg, so, sp, _, sn = cisa.plan(c["block_tables"], c["seq_lens"], ent, num_pages=P,
                                  num_kv_heads=H, **p)
    cp_, cc_, _ = cisa.select_pages(iq, c["k_cache"], reps, c["block_tables"], c["seq_lens"], ent,
                                    p["budget"], p["window"], p["qshare"], 0, False, sp.numel(),
                                    sn.numel())
    with pytest.raises(ValueError, match="attends only page lists it plans itself"):
        cisa.paged_attention(q.cuda(), k, v, c["block_tables"], c["seq_lens"], ent, sg, so, cp_,
                             cc_, 0.0, 0)
    with pytest.raises(ValueError, match="sliding window applies to dense plans only"):
        cisa.paged_attention(q.cuda(), k, v, c["block_tables"], c["seq_lens"], ent, sg, so, cp_,
                             cc_, 0.0, 16)
    # The ops still work after every error.
    got = cisa.chunk_scores(torch.ones(H, 128, device="cuda"), r, table, 0, 4)
    assert got.shape == (H, 4) and torch.isfinite(got).all()
    out, _ = cisa.paged_attention(q.cuda(), k, v, *batch, 0.0, 0)
    assert torch.isfinite(out).all()


# ---- Quest representatives (per-channel min, then max) on the Hopper backend ------------------

@cuda_build
@pytest.mark.parametrize("d", [64, 128])
def test_cuda_quest_matches_cpu(d):
    """Quest's representatives are exact (a min and a max of bf16 keys); its scores, selection
    and the attention over the selected pages on CUDA against the CPU ops, as for the mean."""
    p = SEL_PARAMS[0]
    c, reps, q, iq = sel_setup(d, seed=40, rep_kind="quest")
    dreps = torch.zeros_like(reps).cuda()
    cisa.update_representatives(dreps, c["k_cache"].cuda(), c["full"].cuda(), "quest")
    assert torch.equal(dreps.cpu(), reps)
    # Scores: f32 sums of d terms max(q_i lo_i, q_i hi_i) in another order.
    qs = torch.randn(H, d, generator=torch.Generator().manual_seed(41))
    table = c["block_tables"][0].contiguous()
    want = cisa.chunk_scores(qs, reps, table, 2, 30, "quest")
    got = cisa.chunk_scores(qs.cuda(), dreps, table, 2, 30, "quest").cpu()
    r = reps[table[2:32].long()].float().abs().permute(1, 0, 2)  # [H, n, 2d]
    mag = (qs.abs()[:, None, :] * torch.maximum(r[..., :d], r[..., d:])).sum(-1)
    assert ((got - want).abs() <= 2 * d * 2.0 ** -24 * mag / math.sqrt(d) + 1e-30).all()
    # Selection through the op, then attention over the lists it returned on CUDA.
    ent = entries_tensor(SEL_ENTRIES)
    groups, offsets, pages, _, num_selected = cisa.plan(
        c["block_tables"], c["seq_lens"], ent, num_pages=c["num_pages"], num_kv_heads=H, **p)
    args = (p["budget"], p["window"], p["qshare"], p["sink_pages"], p["qshare_query"] == "last",
            pages.numel(), num_selected.numel(), "quest")
    k, v = c["k_cache"].cuda(), c["v_cache"].cuda()
    cpu = cisa.select_pages(iq, c["k_cache"], reps, c["block_tables"], c["seq_lens"], ent, *args)
    gpu = cisa.select_pages(iq.cuda(), k, dreps, c["block_tables"], c["seq_lens"], ent, *args)
    assert_selection_matches(cpu, gpu, (groups, offsets), c, reps, iq, p, "quest")
    out, lse = cisa.paged_attention(q.cuda(), k, v, c["block_tables"], c["seq_lens"], ent, groups,
                                    offsets, gpu[0], gpu[1], 0.0, 0)
    out_cpu, lse_cpu = cisa.paged_attention(q.float(), c["k_cache"], c["v_cache"],
                                            c["block_tables"], c["seq_lens"], ent, groups,
                                            offsets, gpu[0], gpu[1], 0.0, 0)
    torch.testing.assert_close(out.cpu(), out_cpu, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse.cpu(), lse_cpu, rtol=1e-3, atol=1e-3)
    # The wrapper's plan/run on the backend with Quest representatives.
    w = cisa.SparseAttentionWrapper(num_kv_heads=H, device="cuda")
    w.plan(c["block_tables"], c["seq_lens"], ent, num_pages=c["num_pages"], k_cache=k, v_cache=v,
           reps=dreps, num_q_heads=HQ, rep_kind="quest", **p)
    out_w, _ = w.run(q.cuda(), k, v, dreps, iq.cuda())
    torch.cuda.synchronize()
    pw, cw, _ = w.cuda_page_lists()
    assert_selection_matches(cpu, (pw, cw, gpu[2]), (groups, offsets), c, reps, iq, p, "quest")
    with pytest.raises(ValueError, match=r"2 \* head_dim"):
        w.run(q.cuda(), k, v, dreps[..., :d].contiguous(), iq.cuda())
