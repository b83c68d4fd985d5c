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
section 6's mean candidate), or, with ``indexer=`` (a ``.cisaidx`` file from ``cisa calibrate``,
or an explicit ``{(layer, kv_group): head}`` mapping), the chosen head's query after RoPE, or,
where a file chose the fitted mix (``cisa calibrate --fit``), that mix of the group's queries
after RoPE (:func:`apply_mix`; refused on models with q/k norms, such as Gemma 3); a file is
checked against the model's n_layer, n_head, n_head_kv and head_dim only (its weights hash is of
GGUF tensors, which a transformers model cannot match). ``rep_kind="quest"`` scores pages by
Quest's min/max representatives instead of the mean key. A call at position 0 starts new
sequences. Batches may be left-padded (as ``generate()`` pads decoder-only models): each row's
tokens get their own paged sequence, pads are never written to it and their outputs are zeros;
right padding is refused.

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
    order (``tables``). float32 on the CPU, bfloat16 on a CUDA device.

    ``len`` counts transformers' positions (columns of its mask, pads included); row s's first
    ``pad[s]`` positions are left padding, never written: its sequence holds positions
    ``pad[s] .. len - 1`` as 0 .. ``len - pad[s] - 1``."""

    def __init__(self, batch, num_kv_heads, head_dim, pages_per_seq, sliding=0, device="cpu",
                 dtype=torch.float32, rep_kind="mean", pad=None):
        self.batch, self.H, self.d = batch, num_kv_heads, head_dim
        self.sliding = sliding  # the layer's sliding window in tokens, 0 for a global layer
        self.device, self.dtype = torch.device(device), dtype
        self.rep_kind = rep_kind
        self.pad = [0] * batch if pad is None else [int(p) for p in pad]
        self.padded = any(self.pad)
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
        self.reps = torch.zeros(b * cap, H, ops.rep_width(self.rep_kind, d), **kw)
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

    def seq_lens(self, length=None):
        """Tokens of each row's sequence after ``length`` positions (default: ``len``)."""
        n = self.len if length is None else length
        return [max(n - p, 0) for p in self.pad]

    def append(self, key, value):
        """key, value: [batch, H, n, d], the positions after self.len: one indexed copy each
        (the positions of left padding are left out)."""
        n = key.shape[2]
        start, end = self.len, self.len + n
        self.grow(end)
        dev = self.device
        seq = torch.arange(self.batch, device=dev)[:, None]
        if not self.padded:
            pos = torch.arange(start, end, device=dev)
            pages = seq * self.cap + pos[None, :] // PAGE  # [batch, n]: tables[s, pos // PAGE]
            slots = (pos % PAGE).expand(self.batch, n)
            # Advanced indices around a slice put their [batch, n] first: [batch, n, H, d].
            self.k[pages, :, slots] = key.transpose(1, 2).to(self.dtype)
            self.v[pages, :, slots] = value.transpose(1, 2).to(self.dtype)
        else:
            # Row s's position t is its sequence's position t - pad[s]; pads are not written.
            rel = torch.arange(start, end)[None, :] - torch.tensor(self.pad)[:, None]  # [b, n]
            real = rel >= 0
            rel = rel.clamp(min=0)
            pages = (torch.arange(self.batch)[:, None] * self.cap + rel // PAGE)[real].to(dev)
            slots = (rel % PAGE)[real].to(dev)
            real = real.to(dev)
            self.k[pages, :, slots] = key.transpose(1, 2)[real].to(self.dtype)
            self.v[pages, :, slots] = value.transpose(1, 2)[real].to(self.dtype)
        # Logical pages [first, last) of each row filled by this write get representatives
        # (made on the device without padding, so that a decode step can be graph-captured).
        full = None
        if not self.padded:
            first, last = start // PAGE, end // PAGE
            if last > first:
                full = (seq * self.cap + torch.arange(first, last, device=dev)[None, :])
                full = full.reshape(-1).to(torch.int32)
        else:
            pages = [s * self.cap + j for s, p in enumerate(self.pad)
                     for j in range(max(start - p, 0) // PAGE, max(end - p, 0) // PAGE)]
            if pages:
                full = torch.tensor(pages, dtype=torch.int32).to(dev)
        if full is not None:
            ops.update_representatives(self.reps, self.k, full, self.rep_kind)
        self.len = end


def _allowed(mask, q_len):
    """The mask as booleans [rows, q_len, kv_len] (True: attended)."""
    allowed = mask if mask.dtype == torch.bool else mask == 0
    return allowed.reshape(-1, allowed.shape[-2], allowed.shape[-1])[..., -q_len:, :]


def _left_pads(mask, batch, q_len):
    """Each row's left padding, read from the mask of a call that starts new sequences: key
    column j is real when query row j attends to it (every position attends to itself), and
    the real columns must be a suffix (generate()'s left padding). Right padding, or padding
    inside a row, is refused."""
    if mask is None:
        return [0] * batch
    allowed = _allowed(mask, q_len)
    kv_len = allowed.shape[-1]
    if kv_len != q_len:
        return [0] * batch  # not the first call of a sequence: the mask check decides
    real = torch.diagonal(allowed, dim1=-2, dim2=-1).cpu()  # [rows or 1, q_len]
    real = real.expand(batch, q_len) if real.shape[0] == 1 else real
    pads = []
    for row in real:
        p = int(q_len - row.sum())
        if not bool(row[p:].all()):
            raise ValueError("cisa attention: only left padding is supported (the pads of a "
                             "row must come before its tokens, as generate() pads decoder-only "
                             "models: tokenizer.padding_side = 'left'); this mask pads on the "
                             "right or inside a row")
        pads.append(p)
    return pads


def _check_mask(mask, q_len, sliding=0, past=None, pad=None):
    """The mask must be causal (and, with ``sliding``, within the window) and mask exactly the
    left padding ``pad`` of each row (None: no padding). Its last q_len columns are the new
    positions (with transformers' caches and with :class:`Cache`, which hands the attention
    only the new keys but sizes the mask as ``DynamicCache`` would), so key column j and query
    row i of its kv_len columns are kv_len - q_len + i - j positions apart whether or not a
    sliding cache dropped older keys; with ``past`` positions before the call, key column j is
    position past + q_len - kv_len + j. (A host synchronisation; not made while a CUDA graph is
    captured.)"""
    padded = pad is not None and any(pad)
    if mask is None:
        if padded:
            raise ValueError("cisa attention: the layer's sequences are left-padded but this call "
                             "has no attention mask (pass the batch's attention_mask)")
        return
    if mask.is_cuda and torch.cuda.is_current_stream_capturing():
        return  # checked when the same step ran eagerly (its plan had to be made then)
    kv_len = mask.shape[-1]
    allowed = _allowed(mask, q_len)
    k_pos = torch.arange(kv_len, device=mask.device)[None, :]
    q_pos = torch.arange(kv_len - q_len, kv_len, device=mask.device)[:, None]
    expected = k_pos <= q_pos
    if sliding:
        expected &= k_pos > q_pos - sliding
    if padded:
        # Absolute key positions: position past + q_len - kv_len + j is a pad of row s when it
        # is below pad[s].
        first = (past if past is not None else kv_len - q_len) + q_len - kv_len
        p = torch.tensor(pad, device=mask.device)[:, None, None]
        expected = expected[None] & (k_pos[None] + first >= p)
        if allowed.shape[0] != expected.shape[0]:
            raise ValueError("cisa attention: the mask does not have one row per batch row")
    if not torch.equal(allowed, expected.expand_as(allowed)):
        raise ValueError("cisa attention: only causal masks whose padding is on the left are "
                         "supported (rows may start with pads, as generate() pads them; no pad "
                         "after a row's first token, nor padding that changes between calls)")


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


def _num_layers(module):
    config = getattr(module, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    n = getattr(config, "num_hidden_layers", None)
    if n is None:
        raise ValueError("cisa attention: an indexer needs the attention module's config "
                         "(num_hidden_layers) to check the model's shape")
    return int(n)


class _IndexChoice:
    """Which query is each (layer, KV group)'s index query (SPEC section 6): from a calibrated
    ``.cisaidx`` file (an :class:`cisa.indexer.Indexer` or its path) or an explicit mapping
    ``{(layer, kv_group): head}`` (absolute query head, or None / "mean" for the mean of the
    group's heads). A file may also choose the fitted mix of the group's heads (``cisa calibrate
    --fit``), applied with its coefficients (:func:`index_query`). Pairs not listed use the
    mean."""

    def __init__(self, spec):
        from . import indexer as _ix
        self.indexer = None
        self.mixes = {}  # (layer, kv_group) -> the fit's coefficients, where the fit was chosen
        if isinstance(spec, (str, bytes)) or hasattr(spec, "__fspath__"):
            spec = _ix.load_indexer(spec)
        if isinstance(spec, _ix.Indexer):
            self.indexer = spec
            self.heads = spec.heads()
            self.mixes = spec.mixes()
            self.source = f"indexer {spec.source}"
        elif isinstance(spec, dict):
            self.heads = {}
            for key, h in spec.items():
                if not (isinstance(key, tuple) and len(key) == 2 and
                        all(isinstance(x, int) for x in key)):
                    raise ValueError(f"cisa indexer mapping: keys must be (layer, kv_group) "
                                     f"pairs of ints (got {key!r})")
                if h is not None and h != "mean" and not isinstance(h, int):
                    raise ValueError(f"cisa indexer mapping: {key} -> {h!r}: a value is a query "
                                     f"head (int) or None / 'mean'")
                self.heads[key] = None if h in (None, "mean") else int(h)
            self.source = "indexer mapping"
        else:
            raise TypeError(f"cisa: indexer must be a .cisaidx path, a cisa.indexer.Indexer or "
                            f"a {{(layer, kv_group): head}} dict (got {type(spec).__name__})")
        # (n_layer, hq, hkv, d, q/k norms) -> {layer: [choice per KV group]}, a choice being
        # None (the mean), a query head or the fit's [h_g, d/2, 2] coefficients (CPU tensor);
        # (that key, device) -> the same with the coefficients on the device.
        self.checked = {}
        self.on_device = {}

    def layer_heads(self, module, layer, hq, hkv, d, sliding, device=None):
        """The choice of each KV group of ``layer`` (None if the layer has none): None (the
        mean), a query head, or the fitted mix's coefficients ``[h_g, d/2, 2]`` float32 on
        ``device``; checked against the model's shape at the first call with that shape."""
        n_layer = _num_layers(module)
        key = (n_layer, hq, hkv, d, _has_qk_norm(module))
        per_layer = self.checked.get(key)
        if per_layer is None:
            per_layer = self._check(*key)
            self.checked[key] = per_layer
        heads = per_layer.get(layer)
        if heads is not None and sliding:
            raise ValueError(f"cisa attention: the {self.source} chooses index queries for "
                             f"layer {layer}, a sliding-window layer of this model (CISA "
                             f"selects pages on the global layers only): it was made for "
                             f"another model")
        if heads is None or all(not isinstance(h, torch.Tensor) for h in heads):
            return heads
        # The coefficients are copied to the device once (outside any CUDA graph capture: a
        # captured step has run eagerly first).
        dev = torch.device(device) if device is not None else torch.device("cpu")
        moved = self.on_device.setdefault((key, dev), {})
        if layer not in moved:
            moved[layer] = [h.to(dev) if isinstance(h, torch.Tensor) else h for h in heads]
        return moved[layer]

    def _check(self, n_layer, hq, hkv, d, qk_norm):
        if self.indexer is not None:
            self.indexer.check_shape(n_layer, hq, hkv, d)
        hg = hq // hkv
        fitted = sorted(k for k, h in self.heads.items() if h == "fit")
        if fitted and qk_norm:
            raise ValueError(f"cisa attention: the {self.source} chooses the fitted mix of the "
                             f"group's heads (cisa calibrate --fit) for (layer, KV group) "
                             f"{fitted[0]}{' and others' if len(fitted) > 1 else ''}, but this "
                             f"model has q/k norms (a per-head RMSNorm of the queries, as Gemma "
                             f"3's), which the fit does not commute with: the fitted index query "
                             f"needs a model without q/k norms (calibrate without --fit, or pass "
                             f"a head mapping)")
        per_layer = {}
        for (layer, g), h in sorted(self.heads.items()):
            if not (0 <= layer < n_layer and 0 <= g < hkv):
                raise ValueError(f"cisa attention: the {self.source} names layer {layer}, KV "
                                 f"group {g}, but the model has {n_layer} layers of {hkv} KV "
                                 f"groups")
            if h == "fit":
                mix = self.mixes.get((layer, g), ())
                if len(mix) != hg * d or d % 2:
                    raise ValueError(f"cisa attention: the {self.source} has {len(mix)} fit "
                                     f"coefficients for layer {layer}, KV group {g}; a group of "
                                     f"{hg} heads of dimension {d} needs {hg * d}")
                h = torch.tensor(mix, dtype=torch.float32).view(hg, d // 2, 2)
            elif h is not None and not g * hg <= h < (g + 1) * hg:
                raise ValueError(f"cisa attention: the {self.source} picks query head {h} for "
                                 f"layer {layer}, KV group {g}, whose heads are "
                                 f"{g * hg} .. {(g + 1) * hg - 1}")
            per_layer.setdefault(layer, [None] * hkv)[g] = h
        return per_layer


def _has_qk_norm(module):
    """Whether the attention module normalises its queries per head before RoPE (Gemma 3's and
    Qwen3's ``q_norm``)."""
    return getattr(module, "q_norm", None) is not None


def apply_mix(q, mix):
    """The fitted mix of a KV group's query heads (docs/calibration.md, "A fitted index query"):
    ``q`` ``[rows, h_g, d]`` float32 queries after RoPE, ``mix`` ``[h_g, d/2, 2]`` coefficients
    (alpha, beta) per head and RoPE frequency pair i, which act on the pair as the complex number
    alpha + i beta. The coefficients were fitted in the GGUF's channel layout, where pair i is
    the frequency-i pair (llama's RoPE: channels (2i, 2i + 1), which llama.cpp's converter
    permutes from Hugging Face's (i, i + d/2), in the same order; NEOX: (i, i + d/2) in both);
    Hugging Face's rotate_half pairs channels (i, i + d/2), so pair i's coefficients act on
    those: out[i] = sum_h alpha q_h[i] - beta q_h[i + d/2], out[i + d/2] = sum_h beta q_h[i] +
    alpha q_h[i + d/2] (src/calib/index_fit.cpp's apply_mix). Returns ``[rows, d]``."""
    half = q.shape[-1] // 2
    x1, x2 = q[..., :half], q[..., half:]
    a, b = mix[..., 0], mix[..., 1]  # [h_g, d/2]
    return torch.cat(((a * x1 - b * x2).sum(-2), (b * x1 + a * x2).sum(-2)), -1)


def index_query(q, num_kv_heads, heads=None):
    """The index query of every row and KV group (SPEC section 2): float32 ``[rows, num_kv_heads,
    head_dim]`` from the post-RoPE queries ``q`` ``[rows, num_q_heads, head_dim]``; KV group g's
    is the mean of its query heads, or query head ``heads[g]`` where ``heads`` names one, or the
    fitted mix of its heads where ``heads[g]`` is the fit's ``[h_g, d/2, 2]`` coefficients
    (:func:`apply_mix`, on q's device)."""
    rows, hq, d = q.shape
    hg = hq // num_kv_heads
    if heads is None or all(h is None for h in heads):
        return q.view(rows, num_kv_heads, hg, d).float().mean(2).contiguous()

    def one(g, h):
        if h is None:
            return q[:, g * hg:(g + 1) * hg].float().mean(1)
        if isinstance(h, torch.Tensor):
            return apply_mix(q[:, g * hg:(g + 1) * hg].float(), h)
        return q[:, h].float()

    # Basic indexing only (no index tensor made on the host), so a CUDA graph can capture it.
    return torch.stack([one(g, h) for g, h in enumerate(heads)], 1).contiguous()


def make_attention(budget=0, window=128, qshare=16, sink_pages=0, qshare_query="mean",
                   dense=False, rep_kind="mean", indexer=None):
    """An attention function for transformers' AttentionInterface. ``rep_kind``: the page
    representatives, ``"mean"`` or ``"quest"``. ``indexer``: which query head (or, from a file,
    the fitted mix of the heads) is each (layer, KV group)'s index query, a ``.cisaidx`` path, a
    :class:`cisa.indexer.Indexer` or a dict ``{(layer, kv_group): head}`` (None: the mean of every
    group's heads)."""
    ops._rep_code("register", rep_kind)
    choice = _IndexChoice(indexer) if indexer is not None else None
    # Plans of recent steps, shared by the layers of a step with the same geometry: the host
    # plans once per step (on CUDA also the backend's plan), not once per layer.
    plans = collections.OrderedDict()
    # Freed before the interpreter tears the extension module down (on CUDA a plan holds the
    # backend's CudaPlan; alive at shutdown, nanobind reported it as leaked).
    atexit.register(plans.clear)

    def planned(state, b, q_len, hq, hkv, d, sliding, device):
        key = (device, b, state.len, state.cap, q_len, hq, hkv, d, sliding, tuple(state.pad))
        hit = plans.get(key)
        if hit is not None:
            plans.move_to_end(key)
            return hit
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("cisa attention: a step captured in a CUDA graph must have run "
                               "eagerly first (the plan is host work, made outside the capture; "
                               "cisa.transformers.rewind sets the caches back to run it again)")
        # Row s's new positions start at its sequence's position len - q_len - pad[s]; those
        # before its first token (left padding) are not queries.
        entries, real = [], None
        for s, p in enumerate(state.pad):
            first = max(state.len - q_len - p, 0)
            count = state.len - p - first
            if count > 0:
                entries.append([s, first, count])
        if sum(e[2] for e in entries) != b * q_len:
            real = torch.zeros(b, q_len, dtype=torch.bool)
            for s, _, count in entries:
                real[s, q_len - count:] = True
            real = real.to(device)
        entries = torch.tensor(entries, dtype=torch.int64).reshape(-1, 3)
        seq_lens = torch.tensor(state.seq_lens(), dtype=torch.int64)
        w = None
        if entries.shape[0]:
            w = SparseAttentionWrapper(num_kv_heads=hkv, device=device)
            cuda = dict(k_cache=state.k, v_cache=state.v, reps=state.reps, num_q_heads=hq)
            w.plan(state.tables, seq_lens, entries, num_pages=state.k.shape[0],
                   dense=dense or sliding > 0, sliding_window=sliding, budget=budget,
                   window=window, qshare=qshare, sink_pages=sink_pages,
                   qshare_query=qshare_query, rep_kind=rep_kind,
                   **(cuda if device.type == "cuda" else {}))
        hit = (w, w.pages_read() if w is not None else (0, 0), real)
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
        heads = None
        if choice is not None:
            heads = choice.layer_heads(module, getattr(module, "layer_idx", None), hq, hkv, d,
                                       sliding, query.device)
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
        else:
            past = kv_len - q_len
        state = getattr(module, "_cisa_cache", None)
        fresh = (state is None or past == 0 or state.batch != b or state.device != query.device)
        # Left padding: read from the mask when new sequences start, kept by the layer after.
        pad = (_left_pads(attention_mask, b, q_len) if past == 0 else None) if fresh else state.pad
        # transformers' sliding cache keeps the last sliding - 1 keys; the paged cache keeps all.
        truncated = (told is None and sliding and not fresh
                     and min(state.len, sliding - 1) <= past < state.len)
        _check_mask(attention_mask, q_len, sliding, state.len if truncated else past, pad)
        if told is not None:
            told[2] = True  # taken: the cache layer checks this at its next update
            if not fresh and 0 < past < state.len:
                state.len = past  # the cache was cropped: the paged cache follows (as rewind)
        if fresh:
            cap = -(-kv_len // PAGE)
            cap = max(64, cap + (cap // 8 if on_cuda else 0))  # CUDA: room to decode first
            state = _LayerCache(b, hkv, d, cap, sliding, device=query.device,
                                dtype=torch.bfloat16 if on_cuda else torch.float32,
                                rep_kind=rep_kind, pad=pad)
            module._cisa_cache = state
        if past != state.len and not truncated:
            raise ValueError(f"cisa attention: the layer's paged cache holds {state.len} "
                             f"positions but this step starts at {past}")
        state.append(key[:, :, kv_len - q_len:], value[:, :, kv_len - q_len:])
        w, (read, read_dense), real = planned(state, b, q_len, hq, hkv, d, sliding,
                                              query.device)
        q = query.transpose(1, 2)  # [b, q_len, hq, d]
        q = q.reshape(b * q_len, hq, d) if real is None else q[real]  # real rows only
        q = q.contiguous() if on_cuda else q.float().contiguous()  # bf16 on CUDA, f32 on the CPU
        out = None
        if w is not None:
            index_q = None if w.dense else index_query(q, hkv, heads)
            out, _ = w.run(q, state.k, state.v, state.reps, index_q,
                           scale=float(scaling) if scaling else 0.0)
        state.pages_read += read
        state.pages_read_dense += read_dense
        if real is None:
            return out.view(b, q_len, hq, d).to(query.dtype), None
        # Left-padding positions attend to nothing: their outputs are zeros (never used).
        full = torch.zeros(b, q_len, hq, d, dtype=query.dtype, device=query.device)
        if out is not None:
            full[real] = out.to(query.dtype)
        return full, None

    return cisa_attention


_REGISTERED = set()  # names given to register(): the implementations a Cache can serve


def register(name="cisa", **params):
    """Registers CISA under ``name`` for ``attn_implementation=name`` (parameters as
    :func:`make_attention`: budget, window, qshare, sink_pages, qshare_query, dense, rep_kind,
    indexer); the mask function is SDPA's (None without padding)."""
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
