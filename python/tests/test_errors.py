"""Bad inputs raise clear Python errors (and leave nothing broken)."""

import pytest
import torch

import cisa
from helpers import entries_tensor, make_cache

H, D, HQ = 2, 32, 4


@pytest.fixture
def env():
    c = make_cache([100, 40], num_kv_heads=H, head_dim=D, seed=4)
    reps = torch.zeros(c["num_pages"], H, D)
    full = torch.cat([c["block_tables"][0, :6], c["block_tables"][1, :2]])
    cisa.update_representatives(reps, c["k_cache"], full)
    ent = entries_tensor([(0, 90, 10), (1, 39, 1)])
    w = cisa.SparseAttentionWrapper(num_kv_heads=H)
    w.plan(c["block_tables"], c["seq_lens"], ent, num_pages=c["num_pages"], budget=1, window=1)
    q, iq = torch.randn(11, HQ, D), torch.randn(11, H, D)
    w.run(q, c["k_cache"], c["v_cache"], reps, iq)  # fills the page lists
    return c, reps, ent, w, q, iq


def attend(c, w, q, **over):
    a = dict(q=q, k_cache=c["k_cache"], v_cache=c["v_cache"], block_tables=c["block_tables"],
             seq_lens=c["seq_lens"], entries=w.entries, groups=w.groups, offsets=w.offsets,
             pages=w.pages, chunks=w.chunks, scale=0.0, sliding_window=0) | over
    return cisa.paged_attention(**a)


def test_good_inputs_run(env):
    c, reps, ent, w, q, iq = env
    out, lse = w.run(q, c["k_cache"], c["v_cache"], reps, iq)
    assert out.shape == q.shape and torch.isfinite(out).all()


def test_wrong_dtype(env):
    c, reps, ent, w, q, iq = env
    w.run(q, c["k_cache"], c["v_cache"], reps, iq)
    with pytest.raises(TypeError, match=r"cisa.paged_attention: q must be float32 \(got float64\)"):
        attend(c, w, q.double())
    with pytest.raises(TypeError, match="k_cache must be float32 or bfloat16"):
        attend(c, w, q, k_cache=c["k_cache"].half(), v_cache=c["v_cache"].half())
    with pytest.raises(TypeError, match="block_tables must be int32"):
        attend(c, w, q, block_tables=c["block_tables"].long())
    with pytest.raises(ValueError, match="v_cache must match k_cache"):
        attend(c, w, q, v_cache=c["v_cache"].bfloat16())
    with pytest.raises(TypeError, match="index_q must be float32"):
        w.run(q, c["k_cache"], c["v_cache"], reps, iq.half())


def test_wrong_shape(env):
    c, reps, ent, w, q, iq = env
    with pytest.raises(ValueError, match=r"q must be \[rows = 11"):
        attend(c, w, q[:5])
    with pytest.raises(ValueError, match="must be a positive multiple of num_kv_heads"):
        attend(c, w, torch.randn(11, 3, D))
    with pytest.raises(ValueError, match="k_cache must have 4 dimensions"):
        attend(c, w, q, k_cache=c["k_cache"][0])
    with pytest.raises(ValueError, match=r"index_q must be \[rows, num_kv_heads, head_dim\]"):
        w.run(q, c["k_cache"], c["v_cache"], reps, iq[:, :1].contiguous())
    with pytest.raises(ValueError, match=r"reps must be \[num_pages, num_kv_heads, head_dim\]"):
        w.run(q, c["k_cache"], c["v_cache"], reps[:-1], iq)
    with pytest.raises(ValueError, match="must be contiguous"):
        attend(c, w, q.transpose(0, 1).contiguous().transpose(0, 1))
    with pytest.raises(ValueError, match="seq_lens has 1 entries but block_tables has 2 rows"):
        attend(c, w, q, seq_lens=c["seq_lens"][:1].clone())


def test_wrong_device(env):
    # On meta tensors the registered ops run their fake implementation (shapes only, as under
    # torch.compile); the implementations themselves refuse them.
    c, reps, ent, w, q, iq = env
    out, lse = attend(c, w, q.to("meta"), k_cache=c["k_cache"].to("meta"),
                      v_cache=c["v_cache"].to("meta"))
    assert out.device.type == "meta" and out.shape == q.shape and lse.shape == q.shape[:2]
    a = dict(q=q, k_cache=c["k_cache"], v_cache=c["v_cache"], block_tables=c["block_tables"],
             seq_lens=c["seq_lens"], entries=w.entries, groups=w.groups, offsets=w.offsets,
             pages=w.pages, chunks=w.chunks, scale=0.0, sliding_window=0)
    impl = cisa.ops._paged_attention_impl
    with pytest.raises(ValueError, match="block_tables must be on cpu"):
        impl(**(a | dict(block_tables=c["block_tables"].to("meta"))))
    with pytest.raises(ValueError, match="all data tensors must be on one device"):
        impl(**(a | dict(q=q.to("meta"))))
    with pytest.raises(ValueError, match="tensors on meta are not supported"):
        impl(**(a | dict(q=q.to("meta"), k_cache=c["k_cache"].to("meta"),
                         v_cache=c["v_cache"].to("meta"))))


def test_page_id_out_of_range(env):
    c, reps, ent, w, q, iq = env
    bad = c["block_tables"].clone()
    bad[0, 3] = c["num_pages"] + 7
    with pytest.raises(IndexError, match=r"block_tables row 0: .*page ID %d \(logical page 3\) "
                       r"is out of range" % (c["num_pages"] + 7)):
        attend(c, w, q, block_tables=bad)
    with pytest.raises(IndexError, match="out of range"):
        cisa.plan(bad, c["seq_lens"], ent, num_pages=c["num_pages"], num_kv_heads=H)
    pages = w.pages.clone()
    pages[2] = -5
    with pytest.raises(IndexError, match=r"page ID -5 \(entry 2 of the page lists\) is out of range"):
        attend(c, w, q, pages=pages)
    with pytest.raises(IndexError, match=r"update_representatives: .*page ID 999 \(entry 1\) is out of range"):
        cisa.update_representatives(reps, c["k_cache"], torch.tensor([1, 999], dtype=torch.int32))
    with pytest.raises(IndexError, match="page ID 999 .* out of range"):
        cisa.chunk_scores(torch.randn(H, D), reps, torch.tensor([0, 999], dtype=torch.int32), 0, 2)
    # A page of another sequence in a list: the engine refuses it.
    pages = w.pages.clone()
    pages[0] = c["block_tables"][1, 0]
    with pytest.raises(ValueError, match="page"):
        attend(c, w, q, pages=pages)
    # The same page in two block tables.
    dup = c["block_tables"].clone()
    dup[1, 0] = dup[0, 0]
    with pytest.raises(ValueError, match="already in use"):
        attend(c, w, q, block_tables=dup)
    # Still usable afterwards.
    out, _ = w.run(q, c["k_cache"], c["v_cache"], reps, iq)
    assert torch.isfinite(out).all()


def test_bad_batch_and_params(env):
    c, reps, ent, w, q, iq = env
    with pytest.raises(IndexError, match=r"entries\[0\] names sequence 5"):
        cisa.plan(c["block_tables"], c["seq_lens"], entries_tensor([(5, 0, 1)]),
                  num_pages=c["num_pages"], num_kv_heads=H)
    with pytest.raises(IndexError, match="only 100 tokens"):
        cisa.plan(c["block_tables"], c["seq_lens"], entries_tensor([(0, 95, 10)]),
                  num_pages=c["num_pages"], num_kv_heads=H)
    with pytest.raises(ValueError, match="budget"):
        cisa.plan(c["block_tables"], c["seq_lens"], ent, num_pages=c["num_pages"],
                  num_kv_heads=H, budget=-1)
    with pytest.raises(ValueError, match="qshare_query must be 'mean' or 'last'"):
        cisa.plan(c["block_tables"], c["seq_lens"], ent, num_pages=c["num_pages"],
                  num_kv_heads=H, qshare_query="max")
    with pytest.raises(ValueError, match="needs 7 pages but block_tables has"):
        cisa.plan(c["block_tables"][:, :2].contiguous(), c["seq_lens"], ent,
                  num_pages=c["num_pages"], num_kv_heads=H)
    with pytest.raises(ValueError, match="plan again"):
        torch.ops.cisa.select_pages(iq, c["k_cache"], reps, c["block_tables"], c["seq_lens"], ent,
                                    1, 1, 1, 0, False, w.pages.numel() + 1,
                                    w.num_selected.numel())
    with pytest.raises(RuntimeError, match="call plan"):
        cisa.SparseAttentionWrapper(num_kv_heads=H).run(q, c["k_cache"], c["v_cache"])
    with pytest.raises(ValueError, match="k must be >= 0"):
        cisa.topk(torch.randn(2, 3), -1)


def test_cuda_tensors_are_refused_by_a_cpu_build():
    # The check the ops run on their data tensors, fed an object on a CUDA device (this machine
    # has none; tests/test_gpu.py runs the real thing where one exists).
    class OnCuda:
        device = torch.device("cuda", 0)

    if cisa.HAS_CUDA:
        pytest.skip("this build has the CUDA backend")
    with pytest.raises(RuntimeError, match=r"cisa.paged_attention: this cisa build has no CUDA "
                       r"backend \(built without CUDA\)"):
        cisa.ops._check_data_device("paged_attention", OnCuda())


def test_representatives_of_the_wrong_width(env):
    """rep_kind says how wide a representative is: a mean-width tensor given as quest (or the
    other way round) and an unknown kind are refused before anything is read or written."""
    c, reps, ent, w, q, iq = env
    full = torch.cat([c["block_tables"][0, :6], c["block_tables"][1, :2]])
    quest = torch.zeros(c["num_pages"], H, 2 * D)
    with pytest.raises(ValueError, match=r"reps must be \[num_pages, num_kv_heads, 2 \* head_dim\]"):
        cisa.update_representatives(reps, c["k_cache"], full, "quest")
    with pytest.raises(ValueError, match=r"reps must be \[num_pages, num_kv_heads, head_dim\]"):
        cisa.update_representatives(quest, c["k_cache"], full)
    assert torch.count_nonzero(quest) == 0
    with pytest.raises(ValueError, match="rep_kind must be 'mean' or 'quest'"):
        cisa.update_representatives(quest, c["k_cache"], full, "moment")
    table = c["block_tables"][0].contiguous()
    with pytest.raises(ValueError, match=r"2 \* head_dim.*rep_kind='quest'"):
        cisa.chunk_scores(torch.randn(H, D), reps, table, 0, 4, "quest")
    with pytest.raises(ValueError, match=r"head_dim\].*rep_kind='mean'"):
        cisa.chunk_scores(torch.randn(H, D), quest, table, 0, 4)
    sel = (iq, c["k_cache"], reps, c["block_tables"], c["seq_lens"], ent, 1, 1, 1, 0, False,
           w.pages.numel(), w.num_selected.numel())
    with pytest.raises(ValueError, match=r"2 \* head_dim"):
        cisa.select_pages(*sel, "quest")
    with pytest.raises(ValueError, match="rep_kind must be 'mean' or 'quest'"):
        w.plan(c["block_tables"], c["seq_lens"], ent, num_pages=c["num_pages"], budget=1,
               window=1, rep_kind="min")
    wq = cisa.SparseAttentionWrapper(num_kv_heads=H)
    wq.plan(c["block_tables"], c["seq_lens"], ent, num_pages=c["num_pages"], budget=1, window=1,
            rep_kind="quest")
    with pytest.raises(ValueError, match=r"2 \* head_dim"):
        wq.run(q, c["k_cache"], c["v_cache"], reps, iq)
    cisa.update_representatives(quest, c["k_cache"], full, "quest")
    out, _ = wq.run(q, c["k_cache"], c["v_cache"], quest, iq)
    assert torch.isfinite(out).all()
