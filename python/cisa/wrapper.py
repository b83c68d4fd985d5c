"""Plan/run wrapper: ``plan`` does the host work of a step once (query groups, page-list sizes,
dense lists), ``run`` selects pages (sparse plans) and attends, reusing the plan's tensors."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _C, ops


class SparseAttentionWrapper:
    """One attention layer's plan/run over a paged K/V cache (layout in :mod:`cisa.ops`).

    >>> w = SparseAttentionWrapper(num_kv_heads=2, page_size=16)
    >>> w.plan(block_tables, seq_lens, entries, num_pages=k_cache.shape[0], budget=64, window=8)
    >>> out, lse = w.run(q, k_cache, v_cache, reps, index_q)

    A plan stays valid for every layer of a step that shares the batch; ``run`` may be called
    once per layer. After ``run``, :attr:`pages` holds the page lists it attended.
    """

    def __init__(self, num_kv_heads: int, page_size: int = 16):
        self.num_kv_heads = num_kv_heads
        self.page_size = page_size
        self._planned = False

    def plan(self, block_tables: Tensor, seq_lens: Tensor, entries: Tensor, *, num_pages: int,
             dense: bool = False, sliding_window: int = 0, budget: int = 0, window: int = 128,
             qshare: int = 1, sink_pages: int = 0, qshare_query: str = "mean") -> None:
        self.block_tables, self.seq_lens, self.entries = block_tables, seq_lens, entries
        (self.groups, self.offsets, self.pages, self.chunks, self.num_selected) = ops.plan(
            block_tables, seq_lens, entries, num_pages=num_pages, num_kv_heads=self.num_kv_heads,
            page_size=self.page_size, dense=dense, sliding_window=sliding_window, budget=budget,
            window=window, qshare=qshare, sink_pages=sink_pages, qshare_query=qshare_query)
        self.dense = dense
        self.sliding_window = sliding_window
        self.params = (budget, window, qshare, sink_pages, qshare_query == "last")
        self._planned = True

    @property
    def num_groups(self) -> int:
        return self.groups.shape[0]

    def pages_read(self):
        """SPEC section 8's traffic of the plan, from the core's ``pages_read``: pages read per KV
        group, summed over every query position (a position reads its list up to its own page),
        as ``(this plan, dense attention)`` for the same positions. Full attention only (a
        sliding-window plan is counted as full)."""
        budget, window, qshare, sinks, _ = self.params
        return _C.pages_read(self.groups.flatten().tolist(), self.page_size, budget, window,
                             qshare, sinks)

    def run(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, reps: Optional[Tensor] = None,
            index_q: Optional[Tensor] = None, scale: float = 0.0):
        if not self._planned:
            raise RuntimeError("cisa.SparseAttentionWrapper.run: call plan() first")
        if not self.dense:
            if reps is None or index_q is None:
                raise ValueError("cisa.SparseAttentionWrapper.run: a sparse plan needs reps and "
                                 "index_q")
            budget, window, qshare, sinks, last = self.params
            self.pages, self.chunks, self.num_selected = torch.ops.cisa.select_pages(
                index_q, k_cache, reps, self.block_tables, self.seq_lens, self.entries, budget,
                window, qshare, sinks, last, self.pages.numel(), self.num_selected.numel())
        return torch.ops.cisa.paged_attention(q, k_cache, v_cache, self.block_tables,
                                              self.seq_lens, self.entries, self.groups,
                                              self.offsets, self.pages, self.chunks, scale,
                                              self.sliding_window)
