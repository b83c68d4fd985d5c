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
    once per layer. After ``run`` on the CPU, :attr:`pages` holds the page lists it attended; on
    CUDA the lists stay on the device (:meth:`cuda_page_lists`, :meth:`cuda_lists`) and
    :attr:`pages` is None.
    """

    def __init__(self, num_kv_heads: int, page_size: int = 16, device="cpu"):
        self.num_kv_heads = num_kv_heads
        self.page_size = page_size
        self.device = torch.device(device)
        self._planned = False
        self._cuda = None
        self._id = id(self)

    def __del__(self):
        ops._CUDA_PLANS.pop(getattr(self, "_id", None), None)

    def plan(self, block_tables: Tensor, seq_lens: Tensor, entries: Tensor, *, num_pages: int,
             dense: bool = False, sliding_window: int = 0, budget: int = 0, window: int = 128,
             qshare: int = 1, sink_pages: int = 0, qshare_query: str = "mean",
             k_cache: Optional[Tensor] = None, v_cache: Optional[Tensor] = None,
             reps: Optional[Tensor] = None, num_q_heads: Optional[int] = None,
             rep_kind: str = "mean") -> None:
        """Host work of a step. ``rep_kind`` is the kind of the representatives ``run`` will
        score (``"mean"``: ``reps`` ``[..., head_dim]``; ``"quest"``: per-channel min and max,
        ``[..., 2 * head_dim]``). On CUDA (``device="cuda"``) also the Hopper backend's plan, which
        needs the layer's ``k_cache``, ``v_cache`` (bfloat16), ``reps`` (sparse plans) and
        ``num_q_heads``, and preallocates ``out`` and ``lse`` for ``run``."""
        ops._rep_code("plan", rep_kind)
        self.rep_kind = rep_kind
        self.block_tables, self.seq_lens, self.entries = block_tables, seq_lens, entries
        last = qshare_query == "last"
        if self.device.type != "cuda":
            (self.groups, self.offsets, self.pages, self.chunks, self.num_selected) = ops.plan(
                block_tables, seq_lens, entries, num_pages=num_pages,
                num_kv_heads=self.num_kv_heads, page_size=self.page_size, dense=dense,
                sliding_window=sliding_window, budget=budget, window=window, qshare=qshare,
                sink_pages=sink_pages, qshare_query=qshare_query)
            self._set_params(dense, sliding_window, budget, window, qshare, sink_pages, last)
            return
        b = ops._batch_args("plan", block_tables, seq_lens, entries)
        # CUDA: one call checks the batch on the host (each block-table page once) and makes
        # both the host plan (query groups and list offsets; no list entry: the backend's plan
        # writes the lists on the device, cuda_page_lists reads them back) and the backend's.
        if not ops.HAS_CUDA:
            _C.plan_groups(b, num_pages, self.num_kv_heads, self.page_size, dense, sliding_window,
                           budget, window, qshare, sink_pages, last)  # the host checks first
            raise RuntimeError("cisa.SparseAttentionWrapper: this cisa build has no CUDA "
                               "backend (built without CUDA)")
        if k_cache is None or v_cache is None or num_q_heads is None or (
                not dense and reps is None):
            raise ValueError("cisa.SparseAttentionWrapper.plan: on CUDA pass k_cache, "
                             "v_cache, num_q_heads and (sparse plans) reps")
        c = ops._cache_args("plan", k_cache, v_cache, reps, rep_kind=rep_kind)
        ops._check_data_device("plan", *[t for t in (k_cache, v_cache, reps) if t is not None])
        self._dev_tables = block_tables.to(k_cache.device)  # the plan reads it on the device
        cp = _C.CudaPlan()
        g, o, self.total_pages, self.num_lists = _C.cuda_plan_groups(
            cp, c, b, self._dev_tables.data_ptr(), num_pages, self.num_kv_heads, self.page_size,
            num_q_heads, dense, sliding_window, budget, window, qshare, sink_pages, last)
        self.groups, self.offsets = g.view(-1, 5), o
        self.pages = self.chunks = self.num_selected = None
        self._cuda = cp
        ops._CUDA_PLANS[self._id] = cp
        rows = cp.rows
        self.out = torch.empty(rows, num_q_heads, c.head_dim, dtype=torch.float32,
                               device=k_cache.device)
        self.lse = torch.empty(rows, num_q_heads, dtype=torch.float32, device=k_cache.device)
        self._set_params(dense, sliding_window, budget, window, qshare, sink_pages, last)

    def _set_params(self, dense, sliding_window, budget, window, qshare, sink_pages, last):
        self.dense = dense
        self.sliding_window = sliding_window
        self.params = (budget, window, qshare, sink_pages, last)
        self._planned = True

    def cuda_page_lists(self):
        """The CUDA plan's page lists after ``run`` (pages, chunks as CPU int32 tensors) and the
        K/V pages its attention reads; synchronises."""
        (_, _, pages, chunks, _), read = _C.cuda_page_lists(self._cuda)
        return (torch.tensor(pages, dtype=torch.int32), torch.tensor(chunks, dtype=torch.int32),
                read)

    def cuda_lists(self):
        """The CUDA plan's whole page lists after ``run``, as CPU tensors: ``dict(groups [G, 5],
        offsets [G * num_kv_heads + 1], pages, chunks, num_selected)`` (the layout of
        :func:`cisa.plan`: list ``i * num_kv_heads + g`` is query group i's for KV group g);
        synchronises."""
        (g, o, p, c, ns), _ = _C.cuda_page_lists(self._cuda)
        return dict(groups=torch.tensor(g, dtype=torch.int64).reshape(-1, 5),
                    offsets=torch.tensor(o, dtype=torch.int64),
                    pages=torch.tensor(p, dtype=torch.int32),
                    chunks=torch.tensor(c, dtype=torch.int32),
                    num_selected=torch.tensor(ns, dtype=torch.int32))

    @property
    def num_groups(self) -> int:
        return self.groups.shape[0]

    def pages_read(self):
        """SPEC section 8's traffic of the plan, from the core's ``pages_read``: pages read per KV
        group, summed over every query position (a position reads its list up to its own page),
        as ``(this plan, dense attention)`` for the same positions. A sliding-window plan counts
        the pages holding each position's window, t - window < s <= t, in both."""
        budget, window, qshare, sinks, _ = self.params
        if self.sliding_window > 0:
            P, W = self.page_size, self.sliding_window
            n = 0
            for g in self.groups.tolist():
                t = torch.arange(g[1], g[2] + 1)
                n += int((t // P - (t - W + 1).clamp(min=0) // P + 1).sum())
            return n, n
        return _C.pages_read(self.groups.flatten().tolist(), self.page_size, budget, window,
                             qshare, sinks)

    def run(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, reps: Optional[Tensor] = None,
            index_q: Optional[Tensor] = None, scale: float = 0.0):
        if not self._planned:
            raise RuntimeError("cisa.SparseAttentionWrapper.run: call plan() first")
        if self._cuda is not None:
            torch.ops.cisa.cuda_run(self._id, q, k_cache, v_cache, reps, index_q, scale,
                                    self.out, self.lse)
            return self.out, self.lse
        if not self.dense:
            if reps is None or index_q is None:
                raise ValueError("cisa.SparseAttentionWrapper.run: a sparse plan needs reps and "
                                 "index_q")
            budget, window, qshare, sinks, last = self.params
            self.pages, self.chunks, self.num_selected = torch.ops.cisa.select_pages(
                index_q, k_cache, reps, self.block_tables, self.seq_lens, self.entries, budget,
                window, qshare, sinks, last, self.pages.numel(), self.num_selected.numel(),
                self.rep_kind)
        return torch.ops.cisa.paged_attention(q, k_cache, v_cache, self.block_tables,
                                              self.seq_lens, self.entries, self.groups,
                                              self.offsets, self.pages, self.chunks, scale,
                                              self.sliding_window)
