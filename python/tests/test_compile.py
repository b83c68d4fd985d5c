"""torch.compile and torch.library checks of the cisa ops (fake implementations, schemas)."""

import torch

import cisa
from helpers import entries_tensor, make_cache, rows_of

H, D, HQ = 2, 32, 4
ENT = [(0, 290, 10), (1, 199, 1)]


def setup():
    c = make_cache([300, 200], num_kv_heads=H, head_dim=D, seed=21)
    P = c["num_pages"]
    reps = torch.zeros(P, H, D)
    full = torch.cat([c["block_tables"][s, : n // 16] for s, n in enumerate([300, 200])])
    cisa.update_representatives(reps, c["k_cache"], full)
    w = cisa.SparseAttentionWrapper(num_kv_heads=H)
    w.plan(c["block_tables"], c["seq_lens"], entries_tensor(ENT), num_pages=P, budget=4,
           window=2, qshare=4)
    rows = rows_of(ENT)
    return c, reps, w, torch.randn(rows, HQ, D), torch.randn(rows, H, D), full


def step(x, wq, index_q, k_cache, v_cache, reps, block_tables, seq_lens, entries, groups,
         offsets, total: int, lists: int):
    # A layer's attention part: projection, selection, sparse attention, output.
    q = (x @ wq).reshape(x.shape[0], HQ, D)
    pages, chunks, _ = torch.ops.cisa.select_pages(index_q, k_cache, reps, block_tables, seq_lens,
                                                   entries, 4, 2, 4, 0, False, total, lists)
    out, lse = torch.ops.cisa.paged_attention(q, k_cache, v_cache, block_tables, seq_lens,
                                              entries, groups, offsets, pages, chunks, 0.0, 0)
    return out.sum(-1) * 2 + lse


def test_torch_compile_fullgraph_matches_eager():
    c, reps, w, _, iq, _ = setup()
    x = torch.randn(iq.shape[0], 64)
    wq = torch.randn(64, HQ * D) / 8
    args = (x, wq, iq, c["k_cache"], c["v_cache"], reps, c["block_tables"], c["seq_lens"],
            w.entries, w.groups, w.offsets, w.pages.numel(), w.num_selected.numel())
    eager = step(*args)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(*args)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    torch._dynamo.reset()
    inductor = torch.compile(step, fullgraph=True)(*args)
    torch.testing.assert_close(inductor, eager, rtol=1e-5, atol=1e-5)


def quest_step(index_q, k_cache, v_cache, reps, block_tables, seq_lens, entries, groups, offsets,
               pages_full, total: int, lists: int):
    # Quest representatives updated, then selection on them and attention, in one graph.
    torch.ops.cisa.update_representatives(reps, k_cache, pages_full, "quest")
    pages, chunks, _ = torch.ops.cisa.select_pages(index_q, k_cache, reps, block_tables, seq_lens,
                                                   entries, 4, 2, 4, 0, False, total, lists,
                                                   "quest")
    q = index_q.repeat_interleave(HQ // H, dim=1).contiguous()
    out, _ = torch.ops.cisa.paged_attention(q, k_cache, v_cache, block_tables, seq_lens, entries,
                                            groups, offsets, pages, chunks, 0.0, 0)
    return out, chunks


def test_torch_compile_traces_quest_selection():
    c, _, w, _, iq, full = setup()
    args = lambda r: (iq, c["k_cache"], c["v_cache"], r, c["block_tables"], c["seq_lens"],
                      w.entries, w.groups, w.offsets, full, w.pages.numel(),
                      w.num_selected.numel())
    r_eager = torch.zeros(c["num_pages"], H, 2 * D)
    eager = quest_step(*args(r_eager))
    r_comp = torch.zeros_like(r_eager)
    compiled = torch.compile(quest_step, fullgraph=True, backend="aot_eager")(*args(r_comp))
    assert torch.equal(r_comp, r_eager) and torch.count_nonzero(r_eager) > 0
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])


def test_compiled_representative_update_mutates_in_place():
    c, reps, _, _, _, full = setup()

    def f(r, k, p):
        torch.ops.cisa.update_representatives(r, k, p)
        return r * 1

    r = torch.zeros_like(reps)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(r, c["k_cache"], full)
    assert torch.equal(r, reps) and torch.equal(got, reps)


def test_opcheck():
    c, reps, w, q, iq, full = setup()
    torch.library.opcheck(torch.ops.cisa.topk.default, (torch.randn(3, 20), 5))
    torch.library.opcheck(torch.ops.cisa.chunk_scores.default,
                          (torch.randn(H, D), reps, c["block_tables"][0].contiguous(), 1, 6))
    torch.library.opcheck(torch.ops.cisa.update_representatives.default,
                          (torch.zeros_like(reps), c["k_cache"], full))
    sel = (iq, c["k_cache"], reps, c["block_tables"], c["seq_lens"], w.entries, 4, 2, 4, 0, False,
           w.pages.numel(), w.num_selected.numel())
    torch.library.opcheck(torch.ops.cisa.select_pages.default, sel)
    pages, chunks, _ = torch.ops.cisa.select_pages(*sel)
    torch.library.opcheck(torch.ops.cisa.paged_attention.default,
                          (q, c["k_cache"], c["v_cache"], c["block_tables"], c["seq_lens"],
                           w.entries, w.groups, w.offsets, pages, chunks, 0.0, 0))
    # Quest representatives: the ops' rep_kind argument ([..., 2 * head_dim] representatives).
    quest = torch.zeros(reps.shape[0], H, 2 * D)
    torch.library.opcheck(torch.ops.cisa.update_representatives.default,
                          (quest, c["k_cache"], full, "quest"))
    torch.ops.cisa.update_representatives(quest, c["k_cache"], full, "quest")
    torch.library.opcheck(torch.ops.cisa.chunk_scores.default,
                          (torch.randn(H, D), quest, c["block_tables"][0].contiguous(), 1, 6,
                           "quest"))
    torch.library.opcheck(torch.ops.cisa.select_pages.default,
                          sel[:2] + (quest,) + sel[3:] + ("quest",))
