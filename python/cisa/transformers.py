"""CISA as an attention backend for Hugging Face transformers (Llama-, Qwen2- and Gemma 3-style
models).

    import cisa.transformers
    cisa.transformers.register("cisa", budget=64, window=8, qshare=16)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="cisa")
    model.generate(...)                                  # prefill and decode through CISA
    cisa.transformers.stats(model)                       # pages read, CISA and dense

Each attention layer keeps its own paged K/V cache and representatives (SPEC section 1) beside
transformers' cache: every call appends the new positions' keys and values, recomputes the
representatives of the pages they filled, plans the step (plan.h's rules) and runs
``select_pages`` and ``paged_attention``. The index query of a KV group is the mean of its query
heads after RoPE (SPEC section 6's mean candidate, no calibrated indexer). A call whose keys
start at position 0 starts new sequences. Batch rows must have equal lengths (no padding).

Layers with a sliding window (Gemma 3's local layers: the ``sliding_window`` argument transformers
passes, else the module's ``sliding_window``) run a dense sliding-window plan (SPEC section 7):
position t attends to t - window < s <= t, as transformers' sliding masks do; transformers'
sliding cache hands such a layer only its last window - 1 keys and the new ones, while the
layer's paged cache keeps every position. CISA selects pages on the global layers only. The model's ``scaling`` (Gemma 3's
``query_pre_attn_scalar ** -0.5``) is used as given; attention logit soft-capping (Gemma 2) and
bidirectional attention are refused.
"""

from __future__ import annotations

import torch

from .wrapper import SparseAttentionWrapper
from . import ops

PAGE = 16


class _LayerCache:
    def __init__(self, batch, num_kv_heads, head_dim, pages_per_seq, sliding=0):
        self.batch, self.H, self.d = batch, num_kv_heads, head_dim
        self.sliding = sliding  # the layer's sliding window in tokens, 0 for a global layer
        self.cap = pages_per_seq
        P = batch * pages_per_seq
        self.k = torch.zeros(P, num_kv_heads, PAGE, head_dim)
        self.v = torch.zeros_like(self.k)
        self.reps = torch.zeros(P, num_kv_heads, head_dim)
        self.tables = (torch.arange(P, dtype=torch.int32).view(batch, pages_per_seq))
        self.len = 0
        self.pages_read = 0
        self.pages_read_dense = 0

    def grow(self, tokens):
        need = -(-tokens // PAGE)
        if need <= self.cap:
            return
        cap = max(need, 2 * self.cap)
        old = (self.k, self.v, self.reps)
        b, H, d = self.batch, self.H, self.d
        self.k = torch.zeros(b * cap, H, PAGE, d)
        self.v = torch.zeros_like(self.k)
        self.reps = torch.zeros(b * cap, H, d)
        for new, o in zip((self.k, self.v, self.reps), old):
            new.view(b, cap, *new.shape[1:])[:, : self.cap] = o.view(b, self.cap, *o.shape[1:])
        self.cap = cap
        self.tables = torch.arange(b * cap, dtype=torch.int32).view(b, cap)

    def append(self, key, value):
        """key, value: [batch, H, n, d], the positions after self.len."""
        n = key.shape[2]
        start, end = self.len, self.len + n
        self.grow(end)
        pos = torch.arange(start, end)
        for s in range(self.batch):
            pages = self.tables[s, pos // PAGE].long()
            self.k[pages, :, pos % PAGE] = key[s].transpose(0, 1).float()
            self.v[pages, :, pos % PAGE] = value[s].transpose(0, 1).float()
        full = torch.arange(start // PAGE, end // PAGE)  # logical pages filled by this write
        if full.numel():
            pages = self.tables[:, full].reshape(-1).contiguous()
            ops.update_representatives(self.reps, self.k, pages)
        self.len = end


def _check_mask(mask, q_len, kv_len, sliding=0):
    """The mask must be causal (and, with ``sliding``, within the window) without padding. Key
    column j and query row i of the kv_len keys are kv_len - q_len + i - j positions apart
    whether or not transformers' sliding cache dropped older keys."""
    if mask is None:
        return
    allowed = mask if mask.dtype == torch.bool else mask == 0
    allowed = allowed.reshape(-1, allowed.shape[-2], allowed.shape[-1])[..., -q_len:, -kv_len:]
    k_pos = torch.arange(kv_len)[None, :]
    q_pos = torch.arange(kv_len - q_len, kv_len)[:, None]
    expected = k_pos <= q_pos
    if sliding:
        expected &= k_pos > q_pos - sliding
    if not torch.equal(allowed.cpu(), expected.expand_as(allowed)):
        raise ValueError("cisa attention: only causal masks without padding are supported "
                         "(batch rows of equal length)")


def make_attention(budget=0, window=128, qshare=16, sink_pages=0, qshare_query="mean",
                   dense=False):
    """An attention function for transformers' AttentionInterface."""

    def cisa_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                       sliding_window=None, softcap=None, **kwargs):
        if softcap is not None:
            raise ValueError("cisa attention: attention logit soft-capping is not supported")
        if not getattr(module, "is_causal", True):
            raise ValueError("cisa attention: only causal attention is supported")
        b, hq, q_len, d = query.shape
        hkv, kv_len = key.shape[1], key.shape[2]
        if sliding_window is None:
            sliding_window = getattr(module, "sliding_window", None)
        sliding = int(sliding_window or 0)
        _check_mask(attention_mask, q_len, kv_len, sliding)
        past = kv_len - q_len  # positions before this call in the keys transformers passes
        state = getattr(module, "_cisa_cache", None)
        if state is None or past == 0 or state.batch != b:
            state = _LayerCache(b, hkv, d, max(64, -(-kv_len // PAGE)), sliding)
            module._cisa_cache = state
        # transformers' sliding cache keeps the last sliding - 1 keys; the paged cache keeps all.
        truncated = sliding and min(state.len, sliding - 1) <= past < state.len
        if past != state.len and not truncated:
            raise ValueError(f"cisa attention: the layer's paged cache holds {state.len} "
                             f"positions but this step starts at {past}")
        start = state.len
        state.append(key[:, :, past:], value[:, :, past:])
        entries = torch.tensor([[s, start, q_len] for s in range(b)], dtype=torch.int64)
        seq_lens = torch.full((b,), state.len, dtype=torch.int64)
        w = SparseAttentionWrapper(num_kv_heads=hkv)
        w.plan(state.tables, seq_lens, entries, num_pages=state.k.shape[0],
               dense=dense or sliding > 0, sliding_window=sliding, budget=budget, window=window,
               qshare=qshare, sink_pages=sink_pages, qshare_query=qshare_query)
        q = query.transpose(1, 2).reshape(b * q_len, hq, d).float().contiguous()
        index_q = q.view(b * q_len, hkv, hq // hkv, d).mean(2).contiguous()
        out, _ = w.run(q, state.k, state.v, state.reps, index_q,
                       scale=float(scaling) if scaling else 0.0)
        read, read_dense = w.pages_read()
        state.pages_read += read
        state.pages_read_dense += read_dense
        return out.view(b, q_len, hq, d).to(query.dtype), None

    return cisa_attention


def register(name="cisa", **params):
    """Registers CISA under ``name`` for ``attn_implementation=name`` (parameters as
    :func:`make_attention`); the mask function is SDPA's (None without padding)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, make_attention(**params))
    AttentionMaskInterface.register(name, sdpa_mask)


def stats(model, layers="all"):
    """Pages read per KV group, summed over every query position and CISA layer since the
    layers' caches were last started: ``(cisa, dense)`` (SPEC section 8). ``layers``: ``"all"``,
    ``"global"`` (layers without a sliding window, where CISA selects) or ``"sliding"`` (dense
    sliding-window plans, which read the pages holding each position's window: equal counts)."""
    if layers not in ("all", "global", "sliding"):
        raise ValueError(f"cisa.transformers.stats: layers must be 'all', 'global' or 'sliding' "
                         f"(got {layers!r})")
    read = dense = 0
    for m in model.modules():
        c = getattr(m, "_cisa_cache", None)
        if c is None or (layers == "global" and c.sliding) or (
                layers == "sliding" and not c.sliding):
            continue
        read += c.pages_read
        dense += c.pages_read_dense
    return read, dense
