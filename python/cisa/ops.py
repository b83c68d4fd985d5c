"""The CISA ops as torch custom operators (namespace ``torch.ops.cisa``).

Layout (one layer, the engine's, ``include/cisa/cpu/kv_cache.h``):

* ``k_cache``, ``v_cache``: ``[num_pages, num_kv_heads, page_size, head_dim]``, float32 or
  bfloat16 (``page_size`` is 16 on CUDA);
* ``reps``: ``[num_pages, num_kv_heads, rep_width]``, same dtype: one representative per full
  page, of the kind ``rep_kind`` names: ``"mean"`` (SPEC section 1's mean key, ``rep_width`` =
  ``head_dim``) or ``"quest"`` (Quest's per-channel min, then max: ``rep_width`` = 2 ``head_dim``,
  scored as the bound sum_i max(q_i min_i, q_i max_i) / sqrt(head_dim));
* ``block_tables``: int32 ``[num_seqs, max_pages]``, row s the physical pages of sequence s in
  logical order (columns past ``ceil(seq_lens[s] / page_size)`` are ignored);
* ``seq_lens``: int64 ``[num_seqs]``, tokens written per sequence;
* ``entries``: int64 ``[num_entries, 3]``, the batch: (sequence, first position, query count);
  queries of all entries are packed row after row.

Every op checks dtype, device, shape and contiguity here and the engine checks page IDs and
positions, raising ``TypeError``, ``ValueError`` or ``IndexError`` with the reason.
Planning, batch tensors and page lists are host (CPU) tensors; the data tensors may be CPU or
CUDA. CUDA tensors need a build with the Hopper backend (``-DCISA_PY_CUDA=ON``; otherwise a clear
error) and its limits: bfloat16 K/V and representatives, ``page_size`` 16, ``head_dim`` 64, 128 or
256, and (``paged_attention``) bfloat16 ``q`` and page lists the backend plans itself (a dense
plan's, or those ``select_pages`` returned on CUDA). Outputs have the CPU op's meaning, dtype and
shape; data outputs are on the input's device, page lists stay host tensors.
"""

from __future__ import annotations

import collections
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C

HAS_CUDA = bool(_C.has_cuda)


def _fail(cls, op: str, msg: str):
    raise cls(f"cisa.{op}: {msg}")


def _check_tensor(op, name, t, dtypes, ndim=None, device=None):
    if not isinstance(t, Tensor):
        _fail(TypeError, op, f"{name} must be a torch.Tensor (got {type(t).__name__})")
    if t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        _fail(TypeError, op, f"{name} must be {want} (got {str(t.dtype).replace('torch.', '')})")
    if ndim is not None and t.dim() != ndim:
        _fail(ValueError, op, f"{name} must have {ndim} dimensions (got shape {tuple(t.shape)})")
    if device is not None and t.device.type != device:
        _fail(ValueError, op, f"{name} must be on {device} (got {t.device})")
    if not t.is_contiguous():
        _fail(ValueError, op, f"{name} must be contiguous (call .contiguous())")


def _check_data_device(op, *tensors):
    dev = tensors[0].device
    for t in tensors[1:]:
        if t.device != dev:
            _fail(ValueError, op, f"all data tensors must be on one device (got {dev} and {t.device})")
    if dev.type == "cuda":
        if not HAS_CUDA:
            _fail(RuntimeError, op, "this cisa build has no CUDA backend (built without CUDA): "
                  "the ops run on CPU tensors only (docs/python.md)")
        return "cuda"
    if dev.type != "cpu":
        _fail(ValueError, op, f"tensors on {dev.type} are not supported (cpu or cuda)")


_KV_DTYPES = (torch.float32, torch.bfloat16)
_CUDA_HEAD_DIMS = (64, 128, 256)
# Representative kinds (kv_cache.h's RepKind) and their codes in _C.CacheArgs.rep.
_REP_KINDS = {"mean": 0, "quest": 1}
_REP_NAMES = {v: k for k, v in _REP_KINDS.items()}


def _rep_code(op, rep_kind) -> int:
    if rep_kind not in _REP_KINDS:
        _fail(ValueError, op, f"rep_kind must be 'mean' or 'quest' (got {rep_kind!r})")
    return _REP_KINDS[rep_kind]


def rep_width(rep_kind: str, head_dim: int) -> int:
    """Values per representative: ``head_dim`` for ``"mean"``, ``2 * head_dim`` for ``"quest"``
    (per-channel min, then max)."""
    return head_dim * (2 if _rep_code("rep_width", rep_kind) else 1)


def _cuda_layer_check(op, c, what="k_cache"):
    """The Hopper backend's limits on a layer (cuda/backend.h), checked before any launch."""
    if not c.bf16:
        _fail(TypeError, op, f"on CUDA {what} must be bfloat16: the Hopper backend reads bf16 K/V "
              "and representatives only (float32 caches run on the CPU op)")
    if c.page_size != 16:
        _fail(ValueError, op, f"on CUDA page_size must be 16, the Hopper kernels' page tile "
              f"(got {c.page_size})")
    if c.head_dim not in _CUDA_HEAD_DIMS:
        _fail(ValueError, op, f"on CUDA head_dim must be 64, 128 or 256, the Hopper backend's "
              f"(got {c.head_dim})")


def _stream(device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def _sync(device) -> None:
    # The backend's downloads are synchronous copies on the legacy default stream; the launches
    # went to torch's current stream, which may be a non-blocking one.
    torch.cuda.current_stream(device).synchronize()


# Positions on the CUDA backend stay below 2^30 (validate_batch_tables in src/cuda/backend.cpp).
_CUDA_MAX_POSITION = 1 << 30
_INDEX = (torch.int32,)


def _cache_args(op, k_cache, v_cache=None, reps=None, rep_kind="mean"):
    rep = _rep_code(op, rep_kind)
    _check_tensor(op, "k_cache", k_cache, _KV_DTYPES, 4)
    P, H, B, d = k_cache.shape
    if v_cache is not None:
        _check_tensor(op, "v_cache", v_cache, _KV_DTYPES, 4)
        if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
            _fail(ValueError, op, f"v_cache must match k_cache (got {tuple(v_cache.shape)} "
                  f"{v_cache.dtype}, k_cache {tuple(k_cache.shape)} {k_cache.dtype})")
    if reps is not None:
        _check_tensor(op, "reps", reps, _KV_DTYPES, 3)
        rw = d * (2 if rep else 1)
        if tuple(reps.shape) != (P, H, rw) or reps.dtype != k_cache.dtype:
            width = "2 * head_dim" if rep else "head_dim"
            _fail(ValueError, op, f"reps must be [num_pages, num_kv_heads, {width}] = {(P, H, rw)} "
                  f"of k_cache's dtype for rep_kind={rep_kind!r} (got {tuple(reps.shape)} "
                  f"{reps.dtype})")
    if d % 8 != 0:
        _fail(ValueError, op, f"head_dim must be a multiple of 8 (got {d})")
    c = _C.CacheArgs()
    c.k = k_cache.data_ptr()
    c.v = (v_cache if v_cache is not None else k_cache).data_ptr()
    c.reps = reps.data_ptr() if reps is not None else 0
    c.bf16 = k_cache.dtype == torch.bfloat16
    c.num_pages, c.num_kv_heads, c.page_size, c.head_dim = P, H, B, d
    c.rep = rep
    return c


def _batch_args(op, block_tables, seq_lens, entries):
    _check_tensor(op, "block_tables", block_tables, _INDEX, 2, "cpu")
    _check_tensor(op, "seq_lens", seq_lens, (torch.int64,), 1, "cpu")
    _check_tensor(op, "entries", entries, (torch.int64,), 2, "cpu")
    if seq_lens.shape[0] != block_tables.shape[0]:
        _fail(ValueError, op, f"seq_lens has {seq_lens.shape[0]} entries but block_tables has "
              f"{block_tables.shape[0]} rows")
    if entries.shape[1] != 3:
        _fail(ValueError, op, f"entries must be [num_entries, 3] (sequence, first, count); "
              f"got {tuple(entries.shape)}")
    b = _C.BatchArgs()
    b.tables = block_tables.data_ptr()
    b.num_seqs, b.max_pages = block_tables.shape
    b.lens = seq_lens.data_ptr()
    b.entries = entries.data_ptr()
    b.num_entries = entries.shape[0]
    return b


def _num_rows(entries: Tensor) -> int:
    return int(entries[:, 2].sum()) if entries.shape[0] else 0


# ---- representatives ------------------------------------------------------------------------

def _update_representatives_impl(reps: Tensor, k_cache: Tensor, pages: Tensor,
                                 rep_kind: str = "mean") -> None:
    """Recomputes ``reps[p]`` for every p in ``pages`` (int32, 1-D, full pages), per KV group:
    the mean of page p's keys (``rep_kind="mean"``, ``reps`` ``[..., head_dim]``) or their
    per-channel min, then max (``"quest"``, ``reps`` ``[..., 2 * head_dim]``)."""
    op = "update_representatives"
    c = _cache_args(op, k_cache, reps=reps, rep_kind=rep_kind)
    if _check_data_device(op, k_cache, reps) == "cuda":
        _check_tensor(op, "pages", pages, _INDEX, 1, "cuda")
        _C.cuda_update_reps(c, pages.data_ptr(), pages.shape[0],
                            torch.cuda.current_stream(k_cache.device).cuda_stream)
        return
    _check_tensor(op, "pages", pages, _INDEX, 1, "cpu")
    _C.update_reps(c, pages.data_ptr(), pages.shape[0])


update_representatives = torch.library.custom_op("cisa::update_representatives", mutates_args=("reps",))(_update_representatives_impl)


@update_representatives.register_fake
def _(reps, k_cache, pages, rep_kind="mean"):
    return None


# ---- selection: scores and top-k ------------------------------------------------------------

def _chunk_scores_impl(q: Tensor, reps: Tensor, block_table: Tensor, first_chunk: int, n: int,
                       rep_kind: str = "mean") -> Tensor:
    """Scores of chunks ``first_chunk <= j < first_chunk + n`` for every KV group g: float32
    ``[num_kv_heads, n]``, ``q[g] . reps[block_table[j], g] / sqrt(head_dim)`` for
    ``rep_kind="mean"``, Quest's bound ``sum_i max(q_i min_i, q_i max_i) / sqrt(head_dim)`` for
    ``"quest"``. ``q``: float32 ``[num_kv_heads, head_dim]``; ``reps``
    ``[num_pages, num_kv_heads, rep_width]``."""
    op = "chunk_scores"
    rep = _rep_code(op, rep_kind)
    _check_tensor(op, "reps", reps, _KV_DTYPES, 3)
    P, H, rw = reps.shape
    _check_tensor(op, "q", q, (torch.float32,), 2)
    if q.shape[0] != H:
        _fail(ValueError, op, f"q must be [num_kv_heads = {H}, head_dim] (got {tuple(q.shape)})")
    d = q.shape[1]
    if rw != d * (2 if rep else 1):
        width = "2 * head_dim" if rep else "head_dim"
        _fail(ValueError, op, f"reps must be [num_pages, num_kv_heads, {width}] = "
              f"{(P, H, d * (2 if rep else 1))} for rep_kind={rep_kind!r} and q's head_dim {d} "
              f"(got {tuple(reps.shape)})")
    if d % 8 != 0:
        _fail(ValueError, op, f"head_dim must be a multiple of 8 (got {d})")
    _check_tensor(op, "block_table", block_table, _INDEX, 1, "cpu")
    c = _C.CacheArgs()
    c.k = c.v = c.reps = reps.data_ptr()
    c.bf16 = reps.dtype == torch.bfloat16
    c.num_pages, c.num_kv_heads, c.page_size, c.head_dim = P, H, 16, d
    c.rep = rep
    if _check_data_device(op, q, reps) == "cuda":
        return _cuda_chunk_scores(op, c, q, block_table, first_chunk, n)
    out = torch.empty((H, n), dtype=torch.float32)
    _C.chunk_scores(c, block_table.data_ptr(), block_table.shape[0], q.data_ptr(), first_chunk, n,
                    out.data_ptr())
    return out


def _cuda_chunk_scores(op, c, q, block_table, first_chunk, n):
    """chunk_scores on the Hopper backend: a one-query sparse plan whose eligible chunks are
    exactly [first_chunk, first_chunk + n) of a copy of the block table (sinks = first_chunk,
    W = 0, k = 1, G = 1, the query at position 16 * (first_chunk + n)), its score stage, and the
    plan's scores (download_scores). With one row the index query is q itself."""
    table_len = block_table.shape[0]
    if first_chunk < 0 or n < 0 or first_chunk + n > table_len:
        _fail(IndexError, op, f"chunks [{first_chunk}, {first_chunk + n}) are not inside the block "
              f"table of {table_len} pages")
    _cuda_layer_check(op, c, "reps")
    sel = block_table[first_chunk:first_chunk + n]
    bad = ((sel < 0) | (sel >= c.num_pages)).nonzero()
    if bad.numel():
        j = int(bad[0, 0])
        _fail(IndexError, op, f"page ID {int(sel[j])} (chunk {first_chunk + j}) is out of range "
              f"[0, {c.num_pages})")
    if n == 0:
        return torch.empty((c.num_kv_heads, 0), dtype=torch.float32, device=q.device)
    m = max(n, 2)  # a selecting list needs more eligible chunks than its k = 1
    if (first_chunk + m + 1) * 16 >= _CUDA_MAX_POSITION:
        _fail(ValueError, op, "on CUDA first_chunk + n must stay below 2^26 - 2 (the backend's "
              "positions are below 2^30)")
    table = torch.full((first_chunk + m + 1,), int(sel[0]), dtype=torch.int32)
    table[first_chunk:first_chunk + n] = sel  # other entries: a valid page, never scored
    dev = q.device
    with torch.cuda.device(dev):
        d_table = table.to(dev)
        cp = _C.CudaPlan()
        _C.cuda_plan_raw(cp, c, d_table.data_ptr(), [0, table.numel()],
                         [(0, 16 * (first_chunk + m), 1)], 1, 0, first_chunk, op)
        st = _stream(dev)
        _C.cuda_select_stage(cp, c, q.data_ptr(), 0, st, op)
        _C.cuda_select_stage(cp, c, q.data_ptr(), 1, st, op)
        _sync(dev)
        scores, _ = _C.cuda_download_scores(cp)
    out = torch.tensor(scores, dtype=torch.float32).reshape(c.num_kv_heads, m)[:, :n]
    return out.contiguous().to(dev)


chunk_scores = torch.library.custom_op("cisa::chunk_scores", mutates_args=())(_chunk_scores_impl)


@chunk_scores.register_fake
def _(q, reps, block_table, first_chunk, n, rep_kind="mean"):
    return q.new_empty((reps.shape[1], n), dtype=torch.float32)


def _topk_impl(scores: Tensor, k: int) -> Tensor:
    """Indices of the k largest scores of each row (ties: the smaller index; NaN ranks below
    every number), in ascending order: int32 ``[rows, min(k, n)]``. ``scores``: float32
    ``[rows, n]``."""
    op = "topk"
    _check_tensor(op, "scores", scores, (torch.float32,), 2)
    if k < 0:
        _fail(ValueError, op, f"k must be >= 0 (got {k})")
    if _check_data_device(op, scores) == "cuda":
        return _cuda_topk(op, scores, k)
    rows, n = scores.shape
    out = torch.empty((rows, min(k, n)), dtype=torch.int32)
    _C.topk(scores.data_ptr(), rows, n, k, out.data_ptr())
    return out


def _cuda_topk(op, scores, k):
    """topk on the Hopper backend's top-k (radix select with the same order): a sparse plan of
    one decode list per row over n eligible chunks (sinks 0, W = 0, budget k), the caller's scores
    put in place of the score stage's (upload_scores), its top-k stage, and the selected chunk
    indices of every list. k >= n selects every index (the rule's answer, in ascending order)."""
    rows, n = scores.shape
    dev = scores.device
    m = min(k, n)
    if rows == 0 or m == 0:
        return torch.empty((rows, m), dtype=torch.int32, device=dev)
    if k >= n:
        return torch.arange(n, dtype=torch.int32, device=dev).expand(rows, n).contiguous()
    if (n + 1) * 16 >= _CUDA_MAX_POSITION:
        _fail(ValueError, op, f"on CUDA rows must have fewer than 2^26 - 1 scores (got {n}; the "
              "backend's positions are below 2^30)")
    with torch.cuda.device(dev):
        # The plan needs a layer; nothing of it is read by the setup and top-k stages.
        dummy = torch.zeros((1, 1, 16, 64), dtype=torch.bfloat16, device=dev)
        c = _C.CacheArgs()
        c.k = c.v = c.reps = dummy.data_ptr()
        c.bf16 = True
        c.num_pages, c.num_kv_heads, c.page_size, c.head_dim = 1, 1, 16, 64
        table = torch.zeros(n + 1, dtype=torch.int32, device=dev)  # every chunk on page 0
        cp = _C.CudaPlan()
        _C.cuda_plan_raw(cp, c, table.data_ptr(), [0, n + 1], [(0, 16 * n, 1)] * rows, k, 0, 0, op)
        st = _stream(dev)
        _C.cuda_select_stage(cp, c, 0, 0, st, op)
        _C.cuda_upload_scores(cp, scores.data_ptr(), rows * n, st)
        _C.cuda_select_stage(cp, c, 0, 2, st, op)
        _sync(dev)
        (_, _, _, chunks, _), _ = _C.cuda_page_lists(cp)
    # Each list: the k selected chunks (ascending), then the tail chunk n.
    out = torch.tensor(chunks, dtype=torch.int32).reshape(rows, k + 1)[:, :k]
    return out.contiguous().to(dev)


topk = torch.library.custom_op("cisa::topk", mutates_args=())(_topk_impl)


@topk.register_fake
def _(scores, k):
    return scores.new_empty((scores.shape[0], min(k, scores.shape[1])), dtype=torch.int32)


# ---- planning and page lists ----------------------------------------------------------------

def plan(block_tables: Tensor, seq_lens: Tensor, entries: Tensor, *, num_pages: int,
         num_kv_heads: int, page_size: int = 16, dense: bool = False, sliding_window: int = 0,
         budget: int = 0, window: int = 128, qshare: int = 1, sink_pages: int = 0,
         qshare_query: str = "mean"):
    """Host planning with the core's rules (``include/cisa/core/plan.h``): the query groups
    (dense prefix, then QShare groups of G) and the size of every page list. Returns
    ``(groups, offsets, pages, chunks, num_selected)`` as CPU tensors: groups int64 ``[G, 5]``
    (entry, first, last, row, dense), offsets int64 ``[G * num_kv_heads + 1]``, pages and chunks
    int32 ``[total]``, num_selected int32 ``[G * num_kv_heads]``. A dense plan's lists are
    complete; a sparse plan's entries are -1 until :func:`select_pages` fills them."""
    op = "plan"
    b = _batch_args(op, block_tables, seq_lens, entries)
    if qshare_query not in ("mean", "last"):
        _fail(ValueError, op, f"qshare_query must be 'mean' or 'last' (got {qshare_query!r})")
    # One pass over the used part of each block-table row checks every page ID (range, listed
    # once); the lists come back as tensors over the binding's buffers (no copy).
    g, o, p, c, ns = _C.plan(b, num_pages, num_kv_heads, page_size, dense, sliding_window, budget,
                             window, qshare, sink_pages, qshare_query == "last")
    return g.view(-1, 5), o, p, c, ns


def _select_pages_impl(index_q: Tensor, k_cache: Tensor, reps: Tensor, block_tables: Tensor,
                 seq_lens: Tensor, entries: Tensor, budget: int, window: int, qshare: int,
                 sink_pages: int, qshare_last: bool, total_pages: int,
                 num_lists: int, rep_kind: str = "mean") -> Tuple[Tensor, Tensor, Tensor]:
    """CISA selection (SPEC sections 3-4, the engine's ``select_pages``): index query per
    (query group, KV group), scores against ``reps`` (of the kind ``rep_kind``, as
    :func:`chunk_scores`), top-k, and the page lists with sinks, window and tail. ``index_q``:
    float32 ``[rows, num_kv_heads, head_dim]``. ``total_pages`` and ``num_lists`` are the plan's
    sizes (``pages.numel()``, ``num_selected.numel()``). Returns (pages, chunks, num_selected)."""
    op = "select_pages"
    c = _cache_args(op, k_cache, reps=reps, rep_kind=rep_kind)
    b = _batch_args(op, block_tables, seq_lens, entries)
    _check_tensor(op, "index_q", index_q, (torch.float32,), 3)
    rows = _num_rows(entries)
    if tuple(index_q.shape) != (rows, c.num_kv_heads, c.head_dim):
        _fail(ValueError, op, f"index_q must be [rows, num_kv_heads, head_dim] = "
              f"{(rows, c.num_kv_heads, c.head_dim)} (got {tuple(index_q.shape)})")
    if _check_data_device(op, index_q, k_cache, reps) == "cuda":
        return _cuda_select_pages(op, c, b, index_q, k_cache, reps, block_tables, seq_lens,
                                  entries, (budget, window, qshare, sink_pages, qshare_last),
                                  total_pages, num_lists)
    pages = torch.empty(total_pages, dtype=torch.int32)
    chunks = torch.empty(total_pages, dtype=torch.int32)
    num_selected = torch.empty(num_lists, dtype=torch.int32)
    _C.select(c, b, index_q.data_ptr(), budget, window, qshare, sink_pages, qshare_last,
              pages.data_ptr(), chunks.data_ptr(), num_selected.data_ptr(), total_pages, num_lists)
    return pages, chunks, num_selected


# The last selections select_pages made on CUDA, so that paged_attention on CUDA can attend their
# lists: the backend attends only lists it planned, so it plans the selection again with the
# query head count and checks that the lists it gets are the ones it was given.
_CUDA_SELECTIONS = collections.deque(maxlen=4)


def _cuda_plan_lists(op, c, b, block_tables, dev, num_q_heads, dense, sliding_window, params,
                     index_q):
    """A backend plan of the batch (host checks of pages and positions first, as on the CPU),
    its selection run on the current stream, and its page lists as host tensors. Returns
    (plan, device block tables, (groups, offsets, pages, chunks, num_selected))."""
    budget, window, qshare, sinks, last = params
    d_tables = block_tables.to(dev)
    cp = _C.CudaPlan()
    _C.cuda_plan(cp, c, b, d_tables.data_ptr(), num_q_heads, dense, sliding_window, budget,
                 window, qshare, sinks, last, op)
    st = _stream(dev)
    iq = index_q.data_ptr() if index_q is not None else 0
    for stage in (0, 1, 2):
        _C.cuda_select_stage(cp, c, iq, stage, st, op)
    _sync(dev)
    (g, o, p, ch, ns), _ = _C.cuda_page_lists(cp)
    lists = (torch.tensor(g, dtype=torch.int64).reshape(-1, 5), torch.tensor(o, dtype=torch.int64),
             torch.tensor(p, dtype=torch.int32), torch.tensor(ch, dtype=torch.int32),
             torch.tensor(ns, dtype=torch.int32))
    return cp, d_tables, lists


def _cuda_select_pages(op, c, b, index_q, k_cache, reps, block_tables, seq_lens, entries, params,
                       total_pages, num_lists):
    """select_pages on the Hopper backend: plan_sparse, run_select, and its page lists."""
    _cuda_layer_check(op, c)
    dev = k_cache.device
    with torch.cuda.device(dev):
        _, _, (_, _, pages, chunks, num_selected) = _cuda_plan_lists(
            op, c, b, block_tables, dev, c.num_kv_heads, False, 0, params, index_q)
    if pages.numel() != total_pages or num_selected.numel() != num_lists:
        _fail(ValueError, op, f"the plan has {num_lists} lists of {total_pages} pages but this "
              f"batch and these parameters give {num_selected.numel()} lists of {pages.numel()} "
              "(plan again with the same batch and parameters)")
    _CUDA_SELECTIONS.append(dict(
        params=params, index_q=index_q.detach().clone(), reps=reps, rep=c.rep, device=dev,
        batch=(block_tables.clone(), seq_lens.clone(), entries.clone()),
        pages=pages.clone(), chunks=chunks.clone()))
    return pages, chunks, num_selected


select_pages = torch.library.custom_op("cisa::select_pages", mutates_args=())(_select_pages_impl)


@select_pages.register_fake
def _(index_q, k_cache, reps, block_tables, seq_lens, entries, budget, window, qshare,
      sink_pages, qshare_last, total_pages, num_lists, rep_kind="mean"):
    return (block_tables.new_empty(total_pages), block_tables.new_empty(total_pages),
            block_tables.new_empty(num_lists))


# ---- attention ------------------------------------------------------------------------------

def _paged_attention_impl(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                    seq_lens: Tensor, entries: Tensor, groups: Tensor, offsets: Tensor,
                    pages: Tensor, chunks: Tensor, scale: float,
                    sliding_window: int) -> Tuple[Tensor, Tensor]:
    """Exact attention of every query row over its group's page lists (SPEC section 5), K/V read
    in place from the pages. ``q``: float32 ``[rows, num_q_heads, head_dim]``; query head h
    belongs to KV group ``h // (num_q_heads // num_kv_heads)``; causal by absolute position.
    ``scale`` 0 means 1/sqrt(head_dim). Returns (out float32 like q, lse float32
    ``[rows, num_q_heads]``, natural log of the softmax denominator)."""
    op = "paged_attention"
    c = _cache_args(op, k_cache, v_cache)
    b = _batch_args(op, block_tables, seq_lens, entries)
    on_cuda = isinstance(q, Tensor) and q.device.type == "cuda"
    if on_cuda:
        _check_data_device(op, q)  # a build without CUDA says so first
    if on_cuda and q.dtype != torch.bfloat16:
        _fail(TypeError, op, "on CUDA q must be bfloat16: the Hopper backend's attention reads bf16 "
              f"queries (got {str(q.dtype).replace('torch.', '')}; out and lse are float32, as on "
              "the CPU)")
    _check_tensor(op, "q", q, (torch.bfloat16,) if on_cuda else (torch.float32,), 3)
    rows = _num_rows(entries)
    if q.shape[0] != rows or q.shape[2] != c.head_dim:
        _fail(ValueError, op, f"q must be [rows = {rows}, num_q_heads, head_dim = {c.head_dim}] "
              f"(got {tuple(q.shape)})")
    if q.shape[1] % c.num_kv_heads != 0 or q.shape[1] == 0:
        _fail(ValueError, op, f"num_q_heads ({q.shape[1]}) must be a positive multiple of "
              f"num_kv_heads ({c.num_kv_heads})")
    _check_tensor(op, "groups", groups, (torch.int64,), 2, "cpu")
    _check_tensor(op, "offsets", offsets, (torch.int64,), 1, "cpu")
    _check_tensor(op, "pages", pages, _INDEX, 1, "cpu")
    _check_tensor(op, "chunks", chunks, _INDEX, 1, "cpu")
    G = groups.shape[0]
    if groups.shape[1] != 5 or offsets.shape[0] != G * c.num_kv_heads + 1:
        _fail(ValueError, op, f"groups must be [G, 5] and offsets [G * num_kv_heads + 1] (got "
              f"{tuple(groups.shape)} and {tuple(offsets.shape)}; pass the plan's tensors)")
    if chunks.shape != pages.shape:
        _fail(ValueError, op, "chunks must have the shape of pages")
    if _check_data_device(op, q, k_cache, v_cache) == "cuda":
        return _cuda_paged_attention(op, c, b, q, k_cache, block_tables, seq_lens, entries, groups,
                                     offsets, pages, chunks, scale, sliding_window)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32)
    _C.attend(c, b, groups.data_ptr(), G, offsets.data_ptr(), pages.data_ptr(), chunks.data_ptr(),
              pages.shape[0], q.data_ptr(), q.shape[1], scale, sliding_window, out.data_ptr(),
              lse.data_ptr())
    return out, lse


def _same_batch(rec_batch, block_tables, seq_lens, entries):
    return all(a.shape == t.shape and torch.equal(a, t)
               for a, t in zip(rec_batch, (block_tables, seq_lens, entries)))


def _cuda_paged_attention(op, c, b, q, k_cache, block_tables, seq_lens, entries, groups, offsets,
                          pages, chunks, scale, sliding_window):
    """paged_attention on the Hopper backend. run_attention reads the page lists of a backend
    plan, so the given lists must be ones the backend plans: a dense plan's (plan_dense, with
    this sliding window), or the lists select_pages returned on CUDA for this batch (planned again
    here with this query head count and selected again from the same index query and
    representatives). The plan's lists are compared with the given ones before attending."""
    _cuda_layer_check(op, c)
    if pages.numel():
        bad = ((pages < 0) | (pages >= c.num_pages)).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            _fail(IndexError, op, f"page ID {int(pages[i])} (entry {i} of the page lists) is out "
                  f"of range [0, {c.num_pages})")
    if groups.numel() and (int(groups[:, 0].min()) < 0 or
                           int(groups[:, 0].max()) >= entries.shape[0]):
        _fail(IndexError, op, f"groups name entries outside [0, {entries.shape[0]})")
    if sliding_window < 0:
        _fail(ValueError, op, f"sliding_window must be >= 0 (got {sliding_window})")
    dev = q.device
    hq = q.shape[1]
    all_dense = bool((groups[:, 4] != 0).all()) if groups.numel() else True
    candidates = []
    if all_dense:
        candidates.append((True, (0, 0, 1, 0, False), None, None, 0))
    elif sliding_window > 0:
        _fail(ValueError, op, "on CUDA a sliding window applies to dense plans only (the Hopper "
              "backend's sparse plans have none); sparse lists with a sliding window run on the "
              "CPU op")
    else:
        for rec in reversed(_CUDA_SELECTIONS):
            if (rec["device"] == dev and rec["pages"].shape == pages.shape and
                    torch.equal(rec["pages"], pages) and torch.equal(rec["chunks"], chunks) and
                    _same_batch(rec["batch"], block_tables, seq_lens, entries)):
                candidates.append((False, rec["params"], rec["index_q"], rec["reps"],
                                   rec["rep"]))
    given = (groups, offsets, pages, chunks)
    with torch.cuda.device(dev):
        for dense, params, index_q, reps, rep in candidates:
            cr = c
            if reps is not None:
                width = c.head_dim * (2 if rep else 1)
                if tuple(reps.shape) != (c.num_pages, c.num_kv_heads, width):
                    continue
                cr = _C.CacheArgs()
                cr.k, cr.v, cr.reps, cr.bf16 = c.k, c.v, reps.data_ptr(), True
                cr.num_pages, cr.num_kv_heads = c.num_pages, c.num_kv_heads
                cr.page_size, cr.head_dim, cr.rep = c.page_size, c.head_dim, rep
            cp, d_tables, lists = _cuda_plan_lists(op, cr, b, block_tables, dev, hq, dense,
                                                   sliding_window, params, index_q)
            if not all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(lists, given)):
                continue
            out = torch.empty(q.shape, dtype=torch.float32, device=dev)
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=dev)
            _C.cuda_attend(cp, cr, q.data_ptr(), scale, out.data_ptr(), lse.data_ptr(),
                           _stream(dev))
            # Leaving frees cp's buffers (cudaFree waits for the kernels using them) and returns
            # d_tables to torch's allocator, whose reuse is ordered on this same stream.
            return out, lse
    _fail(ValueError, op, "on CUDA the Hopper backend attends only page lists it plans itself: "
          "a dense plan's lists (cisa.plan(..., dense=True) with this sliding_window) or the "
          "lists select_pages returned on CUDA for this batch, index query and representatives; "
          "these lists are neither (other page lists run on the CPU op)")


paged_attention = torch.library.custom_op("cisa::paged_attention", mutates_args=())(_paged_attention_impl)


@paged_attention.register_fake
def _(q, k_cache, v_cache, block_tables, seq_lens, entries, groups, offsets, pages, chunks,
      scale, sliding_window):
    # out and lse are float32 whatever q's dtype (bfloat16 q on CUDA).
    return q.new_empty(q.shape, dtype=torch.float32), q.new_empty(q.shape[:2], dtype=torch.float32)


# ---- CUDA: the Hopper backend's run step (SparseAttentionWrapper on CUDA tensors) ------------

_CUDA_PLANS = {}  # plan id -> _C.CudaPlan, owned by its SparseAttentionWrapper


def _cuda_run_impl(plan_id: int, q: Tensor, k_cache: Tensor, v_cache: Tensor,
                   reps: Optional[Tensor], index_q: Optional[Tensor], scale: float, out: Tensor,
                   lse: Tensor) -> None:
    """Selection (sparse plans) and attention of a CUDA plan into ``out`` and ``lse``: kernel
    launches only, on the current stream (no allocation, no host synchronisation), so it can be
    captured in a CUDA graph. q bfloat16 ``[rows, num_q_heads, head_dim]``; index_q float32;
    ``reps`` of the representative kind the plan was made for."""
    op = "cuda_run"
    cp = _CUDA_PLANS.get(plan_id)
    if cp is None:
        _fail(ValueError, op, f"no live plan {plan_id} (plan with SparseAttentionWrapper first)")
    c = _cache_args(op, k_cache, v_cache, reps, rep_kind=_REP_NAMES[cp.rep])
    _check_tensor(op, "q", q, (torch.bfloat16,), 3)
    _check_tensor(op, "out", out, (torch.float32,), 3)
    _check_tensor(op, "lse", lse, (torch.float32,), 2)
    if q.shape[0] != cp.rows or out.shape != q.shape or lse.shape != q.shape[:2]:
        _fail(ValueError, op, f"q must be [{cp.rows}, num_q_heads, head_dim] and out, lse its "
              f"shape (got {tuple(q.shape)}, {tuple(out.shape)}, {tuple(lse.shape)})")
    tensors = [q, k_cache, v_cache, out, lse]
    if not cp.dense:
        if reps is None or index_q is None:
            _fail(ValueError, op, "a sparse plan needs reps and index_q")
        _check_tensor(op, "index_q", index_q, (torch.float32,), 3)
        if tuple(index_q.shape) != (cp.rows, c.num_kv_heads, c.head_dim):
            _fail(ValueError, op, f"index_q must be {(cp.rows, c.num_kv_heads, c.head_dim)} "
                  f"(got {tuple(index_q.shape)})")
        tensors += [reps, index_q]
    _check_data_device(op, *tensors)
    _C.cuda_run(cp, c, index_q.data_ptr() if index_q is not None else 0, q.data_ptr(), scale,
                out.data_ptr(), lse.data_ptr(), torch.cuda.current_stream(q.device).cuda_stream)


cuda_run = torch.library.custom_op("cisa::cuda_run", mutates_args=("out", "lse"))(_cuda_run_impl)


@cuda_run.register_fake
def _(plan_id, q, k_cache, v_cache, reps, index_q, scale, out, lse):
    return None
