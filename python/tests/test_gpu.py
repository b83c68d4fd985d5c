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
