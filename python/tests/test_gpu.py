"""GPU checks: they skip, saying why, without a CUDA device."""

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
