"""The cisa ops on the CPU against the C++ engine's own path and fp64 references."""

import math

import pytest
import torch

import cisa
from helpers import (entries_tensor, make_cache, reference_attention, reference_dense,
                     reference_topk, rows_of)

H, D, HQ = 2, 32, 4


def full_pages(c):
    B = c["k_cache"].shape[2]
    return torch.cat([c["block_tables"][s, : int(n) // B]
                      for s, n in enumerate(c["seq_lens"].tolist())])


def with_reps(c, rep_kind="mean"):
    P, Hk, _, d = c["k_cache"].shape
    reps = torch.zeros(P, Hk, cisa.rep_width(rep_kind, d), dtype=c["k_cache"].dtype)
    cisa.update_representatives(reps, c["k_cache"], full_pages(c), rep_kind)
    return reps


def reference_scores(q, r, rep_kind):
    """fp64 scores of one query q [d] against representatives r [n, rep_width]: the mean key's
    q . r / sqrt(d), or Quest's bound sum_i max(q_i min_i, q_i max_i) / sqrt(d)."""
    q, r = q.double(), r.double()
    d = q.shape[0]
    if rep_kind == "mean":
        return r @ q / math.sqrt(d)
    return torch.maximum(r[:, :d] * q, r[:, d:] * q).sum(1) / math.sqrt(d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_representatives_are_page_mean_keys(dtype):
    c = make_cache([70, 33], num_kv_heads=H, head_dim=D, dtype=dtype)
    reps = with_reps(c)
    for s, n in enumerate(c["seq_lens"].tolist()):
        for j in range(n // 16):
            page = int(c["block_tables"][s, j])
            want = c["k_rows"][s][j * 16:(j + 1) * 16].double().mean(0)  # [H, d]
            assert torch.equal(reps[page], want.float().to(dtype)), (s, j)
    # Partial last pages and spare pages keep what they had.
    partial = int(c["block_tables"][0, 70 // 16])
    assert torch.count_nonzero(reps[partial]) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quest_representatives_are_page_min_max_keys(dtype):
    c = make_cache([70, 33], num_kv_heads=H, head_dim=D, dtype=dtype)
    reps = with_reps(c, "quest")
    assert reps.shape == (c["num_pages"], H, 2 * D)
    for s, n in enumerate(c["seq_lens"].tolist()):
        for j in range(n // 16):
            page = int(c["block_tables"][s, j])
            keys = c["k_rows"][s][j * 16:(j + 1) * 16]  # [16, H, d], as stored
            want = torch.cat([keys.min(0).values, keys.max(0).values], -1)  # [H, 2d]
            assert torch.equal(reps[page], want.to(dtype)), (s, j)
    partial = int(c["block_tables"][0, 70 // 16])
    assert torch.count_nonzero(reps[partial]) == 0


def test_topk_tie_rule_and_nan():
    nan = float("nan")
    rows = [[1.0, 3.0, 3.0, 2.0, 3.0, nan, 0.5],
            [nan, nan, 1.0, 1.0, 1.0, 1.0, nan],
            [-1.0, -2.0, float("inf"), float("-inf"), nan, -1.0, -1.0]]
    scores = torch.tensor(rows, dtype=torch.float32)
    for k in range(0, 9):
        got = cisa.topk(scores, k)
        assert got.shape == (3, min(k, 7))
        for r in range(3):
            assert got[r].tolist() == reference_topk(scores[r], k), (r, k)
    g = torch.Generator().manual_seed(3)
    s = torch.randint(0, 5, (4, 200), generator=g).float()  # many ties
    got = cisa.topk(s, 37)
    for r in range(4):
        assert got[r].tolist() == reference_topk(s[r], 37)


@pytest.mark.parametrize("rep_kind", ["mean", "quest"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_scores_match_fp64(dtype, rep_kind):
    c = make_cache([160], num_kv_heads=H, head_dim=D, dtype=dtype)
    reps = with_reps(c, rep_kind)
    q = torch.randn(H, D)
    table = c["block_tables"][0].contiguous()
    got = cisa.chunk_scores(q, reps, table, 2, 7, rep_kind)
    want = torch.stack([reference_scores(q[g], reps[table[2:9].long(), g], rep_kind)
                        for g in range(H)])
    assert got.shape == (H, 7)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


CASES = [
    # lens, entries, params
    ([300, 200], [(0, 290, 10), (1, 199, 1)], dict(budget=4, window=2, qshare=4)),
    ([500], [(0, 380, 120)], dict(budget=6, window=3, qshare=16, sink_pages=1)),
    ([260, 400, 90], [(1, 399, 1), (0, 259, 1), (2, 89, 1)], dict(budget=5, window=1, qshare=1)),
    ([300], [(0, 200, 100)], dict(budget=3, window=2, qshare=8, qshare_query="last")),
]


@pytest.mark.parametrize("rep_kind", ["mean", "quest"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_ops_equal_the_engine(case, dtype, rep_kind):
    """Representatives, page lists and attention equal the engine's own path (a PagedKvCache
    with that representative kind, filled by append, select_pages, attend) bit for bit."""
    lens, ent, params = CASES[case]
    g = torch.Generator().manual_seed(case)
    rows = rows_of(ent)
    k_all = torch.randn(sum(lens), H, D, generator=g)
    v_all = torch.randn(sum(lens), H, D, generator=g)
    q = torch.randn(rows, HQ, D, generator=g)
    iq = torch.randn(rows, H, D, generator=g)
    P = sum((n + 15) // 16 for n in lens) + 2
    kp = torch.empty(P, H, 16, D, dtype=dtype)
    vp, rp = torch.empty_like(kp), torch.empty(P, H, cisa.rep_width(rep_kind, D), dtype=dtype)
    out_ref, lse_ref = torch.empty_like(q), torch.empty(rows, HQ)
    p = dict(budget=0, window=0, qshare=1, sink_pages=0, qshare_query="mean") | params
    tables, (eg, eo, ep, ec, ens) = cisa._C.engine_reference(
        k_all.data_ptr(), v_all.data_ptr(), lens, H, D, 16, P, dtype == torch.bfloat16, ent,
        q.data_ptr(), iq.data_ptr(), HQ, False, p["budget"], p["window"], p["qshare"],
        p["sink_pages"], p["qshare_query"] == "last", kp.data_ptr(), vp.data_ptr(), rp.data_ptr(),
        out_ref.data_ptr(), lse_ref.data_ptr(), 1 if rep_kind == "quest" else 0)
    maxp = max(len(t) for t in tables)
    bt = torch.tensor([t + [-1] * (maxp - len(t)) for t in tables], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int64)
    E = entries_tensor(ent)
    full = torch.cat([bt[s, : n // 16] for s, n in enumerate(lens)])
    reps = torch.zeros_like(rp)
    cisa.update_representatives(reps, kp, full, rep_kind)
    assert torch.equal(reps[full.long()], rp[full.long()])

    w = cisa.SparseAttentionWrapper(num_kv_heads=H)
    w.plan(bt, seq_lens, E, num_pages=P, rep_kind=rep_kind, **p)
    out, lse = w.run(q, kp, vp, reps, iq)
    assert w.groups.flatten().tolist() == eg
    assert w.offsets.tolist() == eo
    assert w.pages.tolist() == ep and w.chunks.tolist() == ec and w.num_selected.tolist() == ens
    assert any(ens), "the case should select pages"
    assert torch.equal(out, out_ref) and torch.equal(lse, lse_ref)


@pytest.mark.parametrize("rep_kind", ["mean", "quest"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_selection_and_attention_match_fp64(case, rep_kind):
    lens, ent, params = CASES[case]
    c = make_cache(lens, num_kv_heads=H, head_dim=D, seed=10 + case)
    reps = with_reps(c, rep_kind)
    rows = rows_of(ent)
    q, iq = torch.randn(rows, HQ, D), torch.randn(rows, H, D)
    w = cisa.SparseAttentionWrapper(num_kv_heads=H)
    w.plan(c["block_tables"], c["seq_lens"], entries_tensor(ent), num_pages=c["num_pages"],
           rep_kind=rep_kind, **params)
    out, lse = w.run(q, c["k_cache"], c["v_cache"], reps, iq)
    # Selection: the top-k of the fp64 scores of the group's index query over the eligible chunks
    # E = {sinks <= j < c(a) - W} (SPEC sections 3-4), in ascending order, after the sinks.
    k, W, sinks = params["budget"], params["window"], params.get("sink_pages", 0)
    last = params.get("qshare_query") == "last"
    for gi, (e, first, glast, row, dense) in enumerate(w.groups.tolist()):
        seq = ent[e][0]
        for kv in range(H):
            li = gi * H + kv
            chunks = w.chunks[w.offsets[li]:w.offsets[li + 1]].tolist()
            if dense:
                assert chunks == list(range(glast // 16 + 1))
                continue
            r0 = row + (glast - first) if last else row
            qbar = iq[r0:row + glast - first + 1, kv].double().mean(0)
            elig = list(range(sinks, first // 16 - W))
            pages = c["block_tables"][seq, elig].long()
            s = reference_scores(qbar, reps[pages, kv], rep_kind)
            top = [elig[i] for i in reference_topk(s, k)]
            tail = list(range(first // 16 - W, glast // 16 + 1))
            assert chunks == list(range(sinks)) + top + tail, (gi, kv)
    ref, rlse = reference_attention(q, c["k_rows"], c["v_rows"], ent, w.groups, w.chunks,
                                    w.offsets, H)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(lse.double(), rlse, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_full_budget_cisa_equals_dense(dtype):
    lens = [700, 333]
    ent = [(0, 500, 200), (1, 332, 1)]
    c = make_cache(lens, num_kv_heads=H, head_dim=D, dtype=dtype, seed=5)
    reps = with_reps(c)
    rows = rows_of(ent)
    q, iq = torch.randn(rows, HQ, D), torch.randn(rows, H, D)
    E = entries_tensor(ent)
    dense = cisa.SparseAttentionWrapper(num_kv_heads=H)
    dense.plan(c["block_tables"], c["seq_lens"], E, num_pages=c["num_pages"], dense=True)
    out_d, lse_d = dense.run(q, c["k_cache"], c["v_cache"])
    sparse = cisa.SparseAttentionWrapper(num_kv_heads=H)
    sparse.plan(c["block_tables"], c["seq_lens"], E, num_pages=c["num_pages"], budget=1000,
                window=4, qshare=16)
    out_s, lse_s = sparse.run(q, c["k_cache"], c["v_cache"], reps, iq)
    assert torch.equal(out_s, out_d) and torch.equal(lse_s, lse_d)
    ref = reference_dense(q, c["k_rows"], c["v_rows"], ent, H)
    torch.testing.assert_close(out_d.double(), ref, rtol=1e-5, atol=2e-6)
    # A budget that selects (k < eligible) reads fewer pages and differs from dense.
    small = cisa.SparseAttentionWrapper(num_kv_heads=H)
    small.plan(c["block_tables"], c["seq_lens"], E, num_pages=c["num_pages"], budget=8,
               window=4, qshare=16)
    out_k, _ = small.run(q, c["k_cache"], c["v_cache"], reps, iq)
    read, dense_read = small.pages_read()
    assert dense.pages_read() == (dense_read, dense_read) == sparse.pages_read()
    assert read < dense_read / 2
    assert not torch.equal(out_k, out_d)


def test_sliding_window_dense_plan_matches_fp64():
    c = make_cache([200], num_kv_heads=H, head_dim=D, seed=8)
    ent = [(0, 150, 50)]
    q = torch.randn(50, HQ, D)
    w = cisa.SparseAttentionWrapper(num_kv_heads=H)
    w.plan(c["block_tables"], c["seq_lens"], entries_tensor(ent), num_pages=c["num_pages"],
           dense=True, sliding_window=40)
    out, _ = w.run(q, c["k_cache"], c["v_cache"])
    want = torch.zeros(50, HQ, D, dtype=torch.float64)
    K, V = c["k_rows"][0].double(), c["v_rows"][0].double()
    for i, t in enumerate(range(150, 200)):
        for h in range(HQ):
            s = K[t - 39:t + 1, h // 2] @ q[i, h].double() / math.sqrt(D)
            want[i, h] = torch.softmax(s, 0) @ V[t - 39:t + 1, h // 2]
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=2e-6)


def test_quest_selects_other_pages_than_the_mean():
    """The two kinds score differently (Quest's bound is an upper bound of every key's score in
    the page, the mean key the average): on the same keys and index queries their selections
    differ, each being its own fp64 top-k (test_selection_and_attention_match_fp64)."""
    lens, ent = [900], [(0, 899, 1)]
    c = make_cache(lens, num_kv_heads=H, head_dim=D, seed=31)
    iq = torch.randn(1, H, D)
    lists = {}
    for kind in ("mean", "quest"):
        w = cisa.SparseAttentionWrapper(num_kv_heads=H)
        w.plan(c["block_tables"], c["seq_lens"], entries_tensor(ent), num_pages=c["num_pages"],
               budget=8, window=2, rep_kind=kind)
        w.run(torch.randn(1, HQ, D), c["k_cache"], c["v_cache"], with_reps(c, kind), iq)
        lists[kind] = w.chunks.tolist()
    assert len(lists["mean"]) == len(lists["quest"])
    assert lists["mean"] != lists["quest"]
