"""One CISA attention step through the PyTorch ops (docs/python.md): two sequences in a paged
cache, their representatives, a plan, selection and attention, against dense attention."""

import torch

import cisa

torch.manual_seed(0)
H, HQ, D, B = 2, 8, 64, 16                # KV heads, query heads, head dim, page size
lens = [4000, 2500]                       # tokens written per sequence
num_pages = sum((n + B - 1) // B for n in lens)

# A paged K/V cache [num_pages, H, 16, D]; sequence s owns the pages in block_tables[s].
k_cache = torch.randn(num_pages, H, B, D)
v_cache = torch.randn(num_pages, H, B, D)
perm = torch.randperm(num_pages).to(torch.int32)  # pages need not be contiguous
n0 = (lens[0] + B - 1) // B
block_tables = torch.full((2, n0), -1, dtype=torch.int32)
block_tables[0] = perm[:n0]
block_tables[1, : num_pages - n0] = perm[n0:]
seq_lens = torch.tensor(lens)

# One mean key per full page and KV group (SPEC section 1).
reps = torch.zeros(num_pages, H, D)
full = torch.cat([block_tables[s, : n // B] for s, n in enumerate(lens)])
cisa.update_representatives(reps, k_cache, full)

# The batch: a 64-token prefill block at the end of sequence 0 and one decode step of sequence 1.
entries = torch.tensor([[0, lens[0] - 64, 64], [1, lens[1] - 1, 1]])
rows = 65
q = torch.randn(rows, HQ, D)
index_q = q.view(rows, H, HQ // H, D).mean(2)   # index query: the mean of each group's heads

sparse = cisa.SparseAttentionWrapper(num_kv_heads=H)
sparse.plan(block_tables, seq_lens, entries, num_pages=num_pages, budget=32, window=4, qshare=16)
out, lse = sparse.run(q, k_cache, v_cache, reps, index_q)

dense = cisa.SparseAttentionWrapper(num_kv_heads=H)
dense.plan(block_tables, seq_lens, entries, num_pages=num_pages, dense=True)
out_dense, _ = dense.run(q, k_cache, v_cache)

read, read_dense = sparse.pages_read()
print(f"query groups: {sparse.num_groups}, pages read: {read} of {read_dense} "
      f"({read / read_dense:.1%})")
print(f"max |CISA - dense| = {(out - out_dense).abs().max():.3f} (random keys: no page stands out)")
