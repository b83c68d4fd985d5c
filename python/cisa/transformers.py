"""CISA as an attention backend for Hugging Face transformers (Llama-, Qwen2- and Gemma 3-style
models), on the CPU engine or, for a model on a CUDA device, the Hopper backend.

    import cisa.transformers
    cisa.transformers.register("cisa", budget=64, window=8, qshare=16)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="cisa")
    model.generate(...)                                  # prefill and decode through CISA
    model.generate(..., cache=cisa.transformers.Cache(model))  # one copy of K/V
    cisa.transformers.stats(model)                       # pages read, CISA and dense

Each attention layer keeps its own paged K/V cache and representatives (SPEC section 1), beside
transformers' cache unless that is a :class:`Cache` (below): every call appends the new
positions' keys and values (one indexed copy per call, no per-token loop), recomputes the
representatives of the pages they filled, plans the step (plan.h's rules) and runs the selection
and the attention. The index query of a KV group is the mean of its query heads after RoPE (SPEC
section 6's mean candidate, no calibrated indexer). A call at position 0 starts new sequences.
Batch rows must have equal lengths (no padding).

On the CPU the caches are float32 and each call runs ``select_pages`` and ``paged_attention``.
When the model's tensors are on a CUDA device (a build with ``-DCISA_PY_CUDA=ON``), the caches
are bfloat16 on that device, the representatives are updated by the CUDA op, and the step runs
through :class:`SparseAttentionWrapper` with ``device="cuda"`` (the Hopper backend's plan, then
``run``: selection and attention, kernel launches only). One plan serves every layer of a step
that has the same geometry (all layers of a Llama or Qwen2 model; Gemma 3's sliding and global
layers plan separately), so the host plans once per step, not once per layer. The backend's
limits hold: the model must be bfloat16 (the kernels read bf16 q, K and V) and head_dim 64, 128
or 256; anything else raises before any work.

Layers with a sliding window (Gemma 3's local layers: the ``sliding_window`` argument transformers
passes, else the module's ``sliding_window``) run a dense sliding-window plan (SPEC section 7):
position t attends to t - window < s <= t, as transformers' sliding masks do; transformers'
sliding cache hands such a layer only its last window - 1 keys and the new ones, while the
layer's paged cache keeps every position. CISA selects pages on the global layers only. The
model's ``scaling`` (Gemma 3's ``query_pre_attn_scalar ** -0.5``) is used as given; attention
logit soft-capping (Gemma 2) and bidirectional attention are refused.

A decode step on CUDA can be captured in a CUDA graph once the same step has run eagerly (its
plan is then cached): :func:`rewind` sets the layers' caches back so that the step can run again.

Passing ``cache=cisa.transformers.Cache(model)`` (transformers 5.17: ``past_key_values=``) to
``model.generate`` (or a forward) removes transformers' copy of K/V: that cache's layers store
nothing (``update`` hands back just the new keys and values) and only count positions, so
``generate()``, position ids and the masks work as with ``DynamicCache``; each layer tells its
attention module how many positions precede the call, and the module's paged cache is the only
copy of K/V. Without it (``DynamicCache``, transformers' default) the absolute position is the
key length minus the query length, as before.
"""

from __future__ import annotations

import atexit
import collections
import weakref

import torch
from transformers.cache_utils import Cache as _HFCache, CacheLayerMixin as _HFCacheLayer

from .wrapper import SparseAttentionWrapper
from . import ops

PAGE = 16
_CUDA_HEAD_DIMS = (64, 128, 256)


class _LayerCache:
    """One layer's paged K/V cache: sequence s owns pages [s * cap, (s + 1) * cap) in logical
    order (``tables``). float32 on the CPU, bfloat16 on a CUDA device."""

    def __init__(self, batch, num_kv_heads, head_dim, pages_per_seq, sliding=0, device="cpu",
                 dtype=torch.float32):
        self.batch, self.H, self.d = batch, num_kv_heads, head_dim
        self.sliding = sliding  # the layer's sliding window in tokens, 0 for a global layer
        self.device, self.dtype = torch.device(device), dtype
        self.cap = 0
        self.k = self.v = self.reps = None
        self._alloc(pages_per_seq)
        self.len = 0
        self.pages_read = 0
        self.pages_read_dense = 0

    def _alloc(self, cap):
        b, H, d = self.batch, self.H, self.d
        old = (self.k, self.v, self.reps)
        kw = dict(dtype=self.dtype, device=self.device)
        self.k = torch.zeros(b * cap, H, PAGE, d, **kw)
        self.v = torch.zeros_like(self.k)
        self.reps = torch.zeros(b * cap, H, d, **kw)
        if self.cap:
            for new, o in zip((self.k, self.v, self.reps), old):
                new.view(b, cap, *new.shape[1:])[:, : self.cap] = o.view(b, self.cap,
                                                                          *o.shape[1:])
        self.cap = cap
        self.tables = torch.arange(b * cap, dtype=torch.int32).view(b, cap)

    def grow(self, tokens):
        need = -(-tokens // PAGE)
        if need > self.cap:
            self._alloc(max(need, 2 * self.cap))

    def append(self, key, value):
        """key, value: [batch, H, n, d], the positions after self.len: one indexed copy each."""
        n = key.shape[2]
        start, end = self.len, self.len + n
        self.grow(end)
        dev = self.device
        pos = torch.arange(start, end, device=dev)
        seq = torch.arange(self.batch, device=dev)[:, None]
        pages = seq * self.cap + pos[None, :] // PAGE  # [batch, n]: tables[s, pos // PAGE]
        slots = (pos % PAGE).expand(self.batch, n)
        # Advanced indices around a slice put their [batch, n] first: [batch, n, H, d].
        self.k[pages, :, slots] = key.transpose(1, 2).to(self.dtype)
        self.v[pages, :, slots] = value.transpose(1, 2).to(self.dtype)
        first, last = start // PAGE, end // PAGE  # logical pages [first, last) filled by this write
        if last > first:
            full = (seq * self.cap + torch.arange(first, last, device=dev)[None, :])
            ops.update_representatives(self.reps, self.k, full.reshape(-1).to(torch.int32))
        self.len = end


def _check_mask(mask, q_len, sliding=0):
    """The mask must be causal (and, with ``sliding``, within the window) without padding. Its
    last q_len columns are the new positions (with transformers' caches and with :class:`Cache`,
    which hands the attention only the new keys but sizes the mask as ``DynamicCache`` would), so
    key column j and query row i of its kv_len columns are kv_len - q_len + i - j positions apart
    whether or not a sliding cache dropped older keys. (A host synchronisation; not made while a
    CUDA graph is captured.)"""
    if mask is None:
        return
    if mask.is_cuda and torch.cuda.is_current_stream_capturing():
        return  # checked when the same step ran eagerly (its plan had to be made then)
    kv_len = mask.shape[-1]
    allowed = mask if mask.dtype == torch.bool else mask == 0
    allowed = allowed.reshape(-1, allowed.shape[-2], allowed.shape[-1])[..., -q_len:, -kv_len:]
    k_pos = torch.arange(kv_len, device=mask.device)[None, :]
    q_pos = torch.arange(kv_len - q_len, kv_len, device=mask.device)[:, None]
    expected = k_pos <= q_pos
    if sliding:
        expected &= k_pos > q_pos - sliding
    if not torch.equal(allowed, expected.expand_as(allowed)):
        raise ValueError("cisa attention: only causal masks without padding are supported "
                         "(batch rows of equal length)")


def _check_cuda(query):
    """The Hopper backend's limits, checked before any work (docs/python.md, CUDA)."""
    if not ops.HAS_CUDA:
        raise RuntimeError("cisa attention: the model is on CUDA but this cisa build has no CUDA "
                           "backend (built without CUDA; rebuild with -DCISA_PY_CUDA=ON, or run "
                           "the model on the CPU)")
    if query.dtype != torch.bfloat16:
        raise TypeError(f"cisa attention: on CUDA the model must be bfloat16 (the Hopper "
                        f"backend reads bf16 q, K and V; got {str(query.dtype)[6:]}): load it "
                        f"with dtype=torch.bfloat16, or run it on the CPU")
    d = query.shape[-1]
    if d not in _CUDA_HEAD_DIMS:
        raise ValueError(f"cisa attention: on CUDA head_dim must be 64, 128 or 256, the Hopper "
                         f"backend's (got {d}); run this model on the CPU")


def make_attention(budget=0, window=128, qshare=16, sink_pages=0, qshare_query="mean",
                   dense=False):
    """An attention function for transformers' AttentionInterface."""
    # Plans of recent steps, shared by the layers of a step with the same geometry: the host
    # plans once per step (on CUDA also the backend's plan), not once per layer.
    plans = collections.OrderedDict()
    # Freed before the interpreter tears the extension module down (on CUDA a plan holds the
    # backend's CudaPlan; alive at shutdown, nanobind reported it as leaked).
    atexit.register(plans.clear)

    def planned(state, b, q_len, hq, hkv, d, sliding, device):
        key = (device, b, state.len, state.cap, q_len, hq, hkv, d, sliding)
        hit = plans.get(key)
        if hit is not None:
            plans.move_to_end(key)
            return hit
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("cisa attention: a step captured in a CUDA graph must have run "
                               "eagerly first (the plan is host work, made outside the capture; "
                               "cisa.transformers.rewind sets the caches back to run it again)")
        entries = torch.tensor([[s, state.len - q_len, q_len] for s in range(b)],
                               dtype=torch.int64)
        seq_lens = torch.full((b,), state.len, dtype=torch.int64)
        w = SparseAttentionWrapper(num_kv_heads=hkv, device=device)
        cuda = dict(k_cache=state.k, v_cache=state.v, reps=state.reps, num_q_heads=hq)
        w.plan(state.tables, seq_lens, entries, num_pages=state.k.shape[0],
               dense=dense or sliding > 0, sliding_window=sliding, budget=budget, window=window,
               qshare=qshare, sink_pages=sink_pages, qshare_query=qshare_query,
               **(cuda if device.type == "cuda" else {}))
        hit = (w, w.pages_read())
        plans[key] = hit
        while len(plans) > 4:
            plans.popitem(last=False)
        return hit

    def cisa_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                       sliding_window=None, softcap=None, **kwargs):
        # Set by a cisa.transformers.Cache layer's update just before this call (taken before
        # any check can raise, so that it never outlives the call it was set for).
        told = module.__dict__.pop("_cisa_past", None)
        if softcap is not None:
            raise ValueError("cisa attention: attention logit soft-capping is not supported")
        if not getattr(module, "is_causal", True):
            raise ValueError("cisa attention: only causal attention is supported")
        b, hq, q_len, d = query.shape
        hkv, kv_len = key.shape[1], key.shape[2]
        on_cuda = query.is_cuda
        if on_cuda:
            _check_cuda(query)
        if sliding_window is None:
            sliding_window = getattr(module, "sliding_window", None)
        sliding = int(sliding_window or 0)
        _check_mask(attention_mask, q_len, sliding)
        # A cisa.transformers.Cache layer tells the positions before this call and hands over
        # only the new keys. Otherwise transformers' cache passed every kept key and the
        # positions before this call are the rest.
        if told is not None and told[1]() is not key:
            told = None  # left by a call that failed before its attention: not for these keys
        if told is not None:
            if kv_len != q_len:
                raise ValueError(f"cisa attention: a cisa.transformers.Cache layer passed "
                                 f"{kv_len} keys for {q_len} queries (only the new ones)")
            past = told[0]
            told[2] = True  # taken: the cache layer checks this at its next update
        else:
            past = kv_len - q_len
        state = getattr(module, "_cisa_cache", None)
        if told is not None and state is not None and 0 < past < state.len:
            state.len = past  # the cache was cropped: the paged cache follows (as rewind)
        if (state is None or past == 0 or state.batch != b or state.device != query.device):
            cap = -(-kv_len // PAGE)
            cap = max(64, cap + (cap // 8 if on_cuda else 0))  # CUDA: room to decode first
            state = _LayerCache(b, hkv, d, cap, sliding, device=query.device,
                                dtype=torch.bfloat16 if on_cuda else torch.float32)
            module._cisa_cache = state
        # transformers' sliding cache keeps the last sliding - 1 keys; the paged cache keeps all.
        truncated = (told is None and sliding
                     and min(state.len, sliding - 1) <= past < state.len)
        if past != state.len and not truncated:
            raise ValueError(f"cisa attention: the layer's paged cache holds {state.len} "
                             f"positions but this step starts at {past}")
        state.append(key[:, :, kv_len - q_len:], value[:, :, kv_len - q_len:])
        w, (read, read_dense) = planned(state, b, q_len, hq, hkv, d, sliding, query.device)
        q = query.transpose(1, 2).reshape(b * q_len, hq, d)
        q = q.contiguous() if on_cuda else q.float().contiguous()  # bf16 on CUDA, f32 on the CPU
        index_q = None
        if not w.dense:
            index_q = q.view(b * q_len, hkv, hq // hkv, d).float().mean(2).contiguous()
        out, _ = w.run(q, state.k, state.v, state.reps, index_q,
                       scale=float(scaling) if scaling else 0.0)
        state.pages_read += read
        state.pages_read_dense += read_dense
        return out.view(b, q_len, hq, d).to(query.dtype), None

    return cisa_attention


_REGISTERED = set()  # names given to register(): the implementations a Cache can serve


def register(name="cisa", **params):
    """Registers CISA under ``name`` for ``attn_implementation=name`` (parameters as
    :func:`make_attention`); the mask function is SDPA's (None without padding)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, make_attention(**params))
    AttentionMaskInterface.register(name, sdpa_mask)
    _REGISTERED.add(name)


class _CacheLayer(_HFCacheLayer):
    """One layer of :class:`Cache`: it stores no keys or values (``keys`` and ``values`` stay
    None) and counts the positions it has seen; ``update`` tells the layer's attention module how
    many positions precede the call and hands back just the new states."""

    is_compileable = False
    is_croppable = True

    def __init__(self, module, sliding_window=None):
        super().__init__()
        self._module = weakref.ref(module)
        self.sliding_window = int(sliding_window) if sliding_window else None
        self.is_sliding = self.sliding_window is not None
        self.length = 0
        self._told = None  # [positions before, weakref to the keys, taken by the attention]

    def __repr__(self):
        return f"{type(self).__name__}(length={self.length}, sliding_window={self.sliding_window})"

    def lazy_initialization(self, key_states, value_states):
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        module = self._module()
        if module is None:
            raise RuntimeError("cisa.transformers.Cache: the model it was made for is gone")
        impl = getattr(getattr(module, "config", None), "_attn_implementation", None)
        if impl is not None and impl not in _REGISTERED:
            raise ValueError(f"cisa.transformers.Cache keeps no keys or values, so it needs a "
                             f"cisa attention function (a name given to "
                             f"cisa.transformers.register; the model's attn_implementation is "
                             f"{impl!r}); use transformers' DynamicCache for other attention")
        if self._told is not None and not self._told[2]:
            raise RuntimeError(f"cisa.transformers.Cache: the attention of layer "
                               f"{getattr(module, 'layer_idx', '?')} did not take the keys of "
                               f"the previous call (it failed, or the model passed other keys "
                               f"to the attention than update returned); reset() the cache")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        # The attention function takes this (only for these very keys) and appends the new
        # positions to its paged cache, the one copy of K/V.
        self._told = [self.length, weakref.ref(key_states), False]
        module._cisa_past = self._told
        self.length += key_states.shape[-2]
        return key_states, value_states

    def get_seq_length(self, *args):
        return self.length

    def get_mask_sizes(self, query_length):
        """As ``DynamicLayer`` and ``DynamicSlidingWindowLayer`` size the mask (older
        transformers pass the cache positions instead of their number)."""
        if isinstance(query_length, torch.Tensor):
            query_length = query_length.shape[0]
        if not self.is_sliding:
            return self.length + query_length, 0
        offset = max(self.length - self.sliding_window + 1, 0)
        if self.length >= self.sliding_window:
            return self.sliding_window - 1 + query_length, offset
        return self.length + query_length, offset

    def get_max_length(self):
        return self.sliding_window if self.is_sliding else -1

    get_max_cache_shape = get_max_length  # the name in older transformers

    def crop(self, tokens_to_remove):
        """A negative number drops that many positions from the end (0: none); a positive one,
        older transformers' meaning, keeps that many. The attention module's paged cache follows
        at its next call."""
        if tokens_to_remove > 0:
            self.length = min(self.length, tokens_to_remove)
        else:
            self.length = max(0, self.length + tokens_to_remove)

    def reset(self):
        self.length = 0
        self._told = None

    def activate_past_recording(self):
        pass  # nothing to record: crop always works

    def offload(self):
        pass

    def prefetch(self):
        pass

    def _refuse(self, what):
        if self.length:
            raise NotImplementedError(f"cisa.transformers.Cache: {what} is not supported (the "
                                      f"paged caches of the attention modules hold one set of "
                                      f"sequences)")

    def reorder_cache(self, beam_idx):
        self._refuse("reordering the batch (beam search)")

    def batch_repeat_interleave(self, repeats):
        self._refuse("repeating the batch")

    def batch_select_indices(self, indices):
        self._refuse("selecting batch rows")


def _attention_modules(model):
    """The model's attention modules in layer order: the modules with an integer ``layer_idx``
    and an ``is_causal`` attribute (Llama, Qwen2 and Gemma 3 attention; not the decoder
    layers)."""
    found = {}
    for m in model.modules():
        i = getattr(m, "layer_idx", None)
        if isinstance(i, int) and hasattr(m, "is_causal"):
            if i in found:
                raise ValueError(f"cisa.transformers.Cache: two attention modules with "
                                 f"layer_idx {i}")
            found[i] = m
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    n = getattr(config, "num_hidden_layers", len(found))
    if not found or sorted(found) != list(range(n)):
        raise ValueError(f"cisa.transformers.Cache: expected attention modules with layer_idx "
                         f"0 .. {n - 1}, found {sorted(found)}")
    return [found[i] for i in range(n)]


class Cache(_HFCache):
    """A transformers cache that keeps no keys or values: pass ``cache=Cache(model)`` (transformers
    5.17: ``past_key_values=``) to ``model.generate`` or a forward whose attention is a registered
    cisa function. Its layers only count positions (``get_seq_length`` and the mask
    sizes are those of ``DynamicCache``, sliding layers included); each attention module's paged
    cache is the one copy of K/V. ``crop`` and ``reset`` work (the paged caches follow at their
    next call); beam search (reordering or repeating the batch) is refused. One cache serves one
    model, and one cache at a time: the paged caches live in the model's attention modules."""

    def __init__(self, model):
        layers = [_CacheLayer(m, getattr(m, "sliding_window", None))
                  for m in _attention_modules(model)]
        super().__init__(layers=layers)


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


def rewind(model, length):
    """Sets every CISA layer cache of ``model`` back to its first ``length`` positions (the
    pages past them are rewritten by the next steps; pages-read counts are kept). With
    transformers' ``DynamicCache.crop(length)`` this lets a step run again, for example to
    capture an eagerly run decode step in a CUDA graph."""
    for m in model.modules():
        c = getattr(m, "_cisa_cache", None)
        if c is not None:
            if length < 0 or length > c.len:
                raise ValueError(f"cisa.transformers.rewind: length must be in [0, {c.len}] "
                                 f"(got {length})")
            c.len = length
