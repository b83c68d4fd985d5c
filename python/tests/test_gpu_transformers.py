"""The transformers backend on CUDA (the Hopper backend): models of the Llama-3.2-1B,
Qwen2.5-0.5B / 1.5B and Gemma 3 1B attention shapes (Gemma's sliding-window layers included),
random weights, bf16 on the GPU, with full-budget CISA against SDPA; a small budget reading
fewer pages; a decode step captured in a CUDA graph.

Random-weight models have nearly flat logits, and with large weights (initializer_range 0.1)
they are chaotic: bf16 SDPA and bf16 eager attention then differ by half the logits' spread. So
the weights keep transformers' scale (0.02) and only the output head is scaled up (untied, x10):
logits are peaked (std ~9) and bf16 errors stay small. The test is built so that a bf16 near-tie
cannot fail it while a real bug would: teacher-forced logits of every generated position (SDPA's
greedy tokens fed to both, prefill then one decode step per token) are compared with the same
model in float32 (the truth); CISA's bf16 error must stay within twice SDPA's own bf16 error plus
2% of the spread. Greedy tokens CISA generates must equal SDPA's up to the first position where
SDPA's top-1 margin is within twice that bound (after a genuine near-tie the continuations may
differ).
"""

import copy

import pytest
import torch

import cisa

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import cisa.transformers as ct  # noqa: E402
from helpers import fitted_indexer  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="no CUDA device (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(not cisa.HAS_CUDA,
                       reason="this cisa build has no CUDA backend (-DCISA_PY_CUDA=ON)"),
]

ct.register("cisa_gpu_full", budget=10**6, window=8, qshare=16)
ct.register("cisa_gpu_small", budget=8, window=4, qshare=16)

VOCAB = 8192
SHAPES = {
    # name: (config class, hidden, intermediate, q heads, KV heads, head_dim, rope theta)
    "llama-3.2-1b": ("LlamaConfig", 2048, 8192, 32, 8, 64, 500000.0),
    "qwen2.5-0.5b": ("Qwen2Config", 896, 4864, 14, 2, 64, 1000000.0),
    "qwen2.5-1.5b": ("Qwen2Config", 1536, 8960, 12, 2, 128, 1000000.0),
    # Gemma 3 1B's attention: head_dim 256, 4:1 heads, q/k norms, query_pre_attn_scalar 256;
    # layers alternate sliding (window 256 here, 512 in the model) and global.
    "gemma-3-1b": ("Gemma3TextConfig", 1152, 6912, 4, 1, 256, 1000000.0),
}


def model_of(shape, layers=4, seed=0):
    """A model of the shape's attention geometry (fewer layers and a smaller vocabulary than the
    real one), random weights (initializer_range 0.02, the output head untied and x10), bf16 on
    the GPU."""
    cls, hidden, inter, hq, hkv, d, theta = SHAPES[shape]
    extra = {}
    if cls == "Gemma3TextConfig":
        extra = dict(head_dim=d, query_pre_attn_scalar=d, sliding_window=256,
                     sliding_window_pattern=2)
    cfg = getattr(transformers, cls)(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=hq, num_key_value_heads=hkv, max_position_embeddings=131072,
        rope_theta=theta, initializer_range=0.02, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=None, pad_token_id=None, **extra)  # no EOS: generate makes every token
    assert (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads) == d
    torch.manual_seed(seed)
    if cls == "Gemma3TextConfig":
        assert cfg.layer_types[:2] == ["sliding_attention", "full_attention"]
        model = transformers.Gemma3ForCausalLM(cfg)
        model.set_attn_implementation("sdpa")
    else:
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)  # peaked logits (std ~9)
    return model.to(device="cuda", dtype=torch.bfloat16).eval()


def prompt(rows, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (rows, n), generator=g).cuda()


@torch.no_grad()
def generate(model, impl, ids, n, **kw):
    model.set_attn_implementation(impl)
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                          do_sample=False, **kw)


@torch.no_grad()
def teacher_forced(model, impl, tokens, p):
    """Logits (float32 [rows, n, vocab]) at positions p - 1 … len - 2 of ``tokens``: a prefill of
    the first p tokens, then one decode step per following token (the decode path)."""
    model.set_attn_implementation(impl)
    cache = transformers.DynamicCache()
    out = model(tokens[:, :p], past_key_values=cache, use_cache=True, logits_to_keep=1)
    logits = [out.logits[:, -1].float()]
    for t in range(p, tokens.shape[1] - 1):
        out = model(tokens[:, t:t + 1], past_key_values=cache, use_cache=True)
        logits.append(out.logits[:, -1].float())
    return torch.stack(logits, 1)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_full_budget_cisa_matches_sdpa(shape):
    model = model_of(shape)
    p, n = 1000, 16
    ids = prompt(2, p, seed=1)
    ref = generate(model, "sdpa", ids, n)
    assert ref.shape == (2, p + n)
    sdpa = teacher_forced(model, "sdpa", ref, p)
    full = teacher_forced(model, "cisa_gpu_full", ref, p)
    caches = [layer.self_attn._cisa_cache for layer in model.model.layers]
    assert all(c.k.is_cuda and c.k.dtype == torch.bfloat16 and c.len == p + n - 1 for c in caches)
    read, dense = ct.stats(model)
    assert read == dense > 0  # full budget: every page, prefill and decode through CISA
    truth = teacher_forced(copy.deepcopy(model).float(), "sdpa", ref, p)  # the same weights
    spread = truth.std().item()
    sdpa_err = (sdpa - truth).abs().max().item()
    cisa_err = (full - truth).abs().max().item()
    bound = 2 * sdpa_err + 0.02 * spread
    print(f"{shape}: logits std {spread:.3f}, |sdpa - fp32| {sdpa_err:.4f}, "
          f"|cisa - fp32| {cisa_err:.4f}, |cisa - sdpa| {(full - sdpa).abs().max().item():.4f}, "
          f"bound {bound:.4f}")
    # A wrong page, position, scale or head mapping moves logits by a good part of their spread.
    assert cisa_err <= bound, f"{shape}: |cisa - fp32| = {cisa_err} over the bound {bound}"
    assert sdpa_err < 0.2 * spread, f"{shape}: bf16 error {sdpa_err} too large to test anything"
    # Greedy tokens. Teacher-forced top-1 of CISA may differ from SDPA's only at a near-tie
    # (SDPA's top-1 margin within 2 x bound); generate() must give SDPA's tokens up to the first
    # position where the teacher-forced top-1 differs (then the continuations may part).
    top2 = sdpa.topk(2, dim=-1).values
    margin = top2[..., 0] - top2[..., 1]
    cisa_flips = full.argmax(-1) != sdpa.argmax(-1)
    assert (margin[cisa_flips] <= 2 * bound).all(), \
        f"{shape}: top-1 differs where SDPA's margin exceeds 2 x bound: " \
        f"{margin[cisa_flips].tolist()}"
    # The reference tokens come from SDPA's generate(), whose steps need not be bit-identical to
    # the teacher-forced SDPA steps (another cache class, another kernel choice): where the two
    # disagree it is a near-tie as well, and the continuations may part there too.
    ref_flips = sdpa.argmax(-1) != ref[:, p:]
    assert (margin[ref_flips] <= 2 * bound).all(), \
        f"{shape}: SDPA's generate() and its teacher-forced steps differ at a clear margin"
    flips = cisa_flips | ref_flips
    # With cisa.transformers.Cache: transformers keeps no K/V, the paged caches are the one copy
    # (past_key_values=: the name older transformers know; newer ones map it to cache=).
    cache = ct.Cache(model)
    gen = generate(model, "cisa_gpu_full", ids, n, past_key_values=cache)
    assert all(layer.keys is None and layer.values is None for layer in cache.layers)
    assert cache.get_seq_length() == p + n - 1
    compared = 0
    for r in range(2):
        at = flips[r].nonzero()
        upto = int(at[0, 0]) if at.numel() else n
        assert gen[r, :p + upto].tolist() == ref[r, :p + upto].tolist(), \
            f"{shape}: row {r} differs from SDPA's tokens before position {upto}"
        if upto < n and not ref_flips[r, upto]:  # the flipped token is CISA's own top-1
            assert int(gen[r, p + upto]) == int(full[r, upto].argmax())
        compared += upto
    print(f"{shape}: greedy tokens equal {compared} of {2 * n} (teacher-forced top-1 flips at "
          f"near-ties: {int(cisa_flips.sum())}; SDPA generate vs teacher-forced: "
          f"{int(ref_flips.sum())})")


@pytest.mark.parametrize("shape", ["llama-3.2-1b", "qwen2.5-1.5b"])
def test_small_budget_reads_fewer_pages(shape):
    model = model_of(shape, layers=2)
    ids = prompt(1, 1500, seed=2)
    out = generate(model, "cisa_gpu_small", ids, 8)
    assert out.shape == (1, 1508)
    read, dense = ct.stats(model)
    assert 0 < read < dense / 2


@torch.no_grad()
def test_fitted_index_query_on_cuda(monkeypatch):
    """A synthetic version-2 indexer choosing the fitted mix (cisa calibrate --fit; random
    coefficients) in every KV group of a 2-layer model of the Llama-3.2-1B shape: through
    generate() on CUDA (k = 8: a prefill, then decode steps) every index query the wrapper runs
    with is on the device and equals index_query of the same bf16 queries on the CPU with the
    file's coefficients; the selection reads under half of dense's pages."""
    model = model_of("llama-3.2-1b", layers=2)
    hq, hkv, d = 32, 8, 64
    hg = hq // hkv
    g = torch.Generator().manual_seed(41)
    choices = {(layer, kv): (torch.randn(hg * d, generator=g) * 0.5).tolist()
               for layer in range(2) for kv in range(hkv)}
    ct.register("cisa_gpu_fit", budget=8, window=4, qshare=16,
                indexer=fitted_indexer(2, hq, hkv, d, choices))
    calls = []
    run = cisa.SparseAttentionWrapper.run

    def recording(self, q, k, v, reps=None, index_q=None, scale=0.0):
        calls.append((q.clone(), index_q.clone()))
        return run(self, q, k, v, reps, index_q, scale)

    monkeypatch.setattr(cisa.SparseAttentionWrapper, "run", recording)
    out = generate(model, "cisa_gpu_fit", prompt(1, 1500, seed=42), 4)
    monkeypatch.undo()
    assert out.shape == (1, 1504) and len(calls) == 2 * 4
    for i, (q, iq) in enumerate(calls):
        heads = [torch.tensor(choices[(i % 2, kv)]).view(hg, d // 2, 2) for kv in range(hkv)]
        assert iq.is_cuda and iq.dtype == torch.float32
        torch.testing.assert_close(iq.cpu(), ct.index_query(q.float().cpu(), hkv, heads),
                                   rtol=1e-5, atol=1e-5)
    read, dense = ct.stats(model)
    assert 0 < read < dense / 2


def test_cuda_refusals_are_clear():
    model = model_of("llama-3.2-1b", layers=1).float()
    model.set_attn_implementation("cisa_gpu_full")
    with pytest.raises(TypeError, match="must be bfloat16"):
        with torch.no_grad():
            model(prompt(1, 40, seed=3))
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2)  # head_dim 32
    small = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    small = small.to(device="cuda", dtype=torch.bfloat16).eval()
    small.set_attn_implementation("cisa_gpu_full")
    with pytest.raises(ValueError, match="head_dim must be 64, 128 or 256"):
        with torch.no_grad():
            small(torch.randint(0, 64, (1, 40), device="cuda"))


@torch.no_grad()
def test_decode_step_replays_in_a_cuda_graph():
    """A decode step of the whole model (CISA selecting with k = 8) run eagerly, captured in a
    CUDA graph and replayed with another token: the replay equals the eager step for that token."""
    model = model_of("llama-3.2-1b", layers=2)
    model.set_attn_implementation("cisa_gpu_small")
    p = 500  # position 500 fills no page: the step is append, select, attend
    ids = prompt(1, p, seed=4)
    cache = transformers.DynamicCache()
    out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    static = out.logits[:, -1].argmax(-1).view(1, 1).clone()
    other = (static + 1) % VOCAB

    def step():
        return model(static, past_key_values=cache, use_cache=True).logits[:, -1].float()

    def back():  # both caches back to p positions (DynamicCache.crop's meaning changed in 5.x)
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[..., :p, :], layer.values[..., :p, :]
        ct.rewind(model, p)

    keep = [(layer.keys, layer.values) for layer in cache.layers]  # the graph reads these
    eager1 = step().clone()  # makes the step's plan (host work) outside the capture
    back()
    keep.append([(layer.keys, layer.values) for layer in cache.layers])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up on a side stream, as torch.cuda.graph wants
    torch.cuda.current_stream().wait_stream(s)
    back()
    keep.append([(layer.keys, layer.values) for layer in cache.layers])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    replay1 = captured.clone()
    static.copy_(other)
    graph.replay()
    torch.cuda.synchronize()
    replay2 = captured.clone()
    back()
    eager2 = step().clone()
    read, dense = ct.stats(model)
    assert read < dense
    assert (eager1 - eager2).abs().max() > 1.0  # another token: other logits
    torch.testing.assert_close(replay1, eager1, rtol=1e-2, atol=2e-2)
    torch.testing.assert_close(replay2, eager2, rtol=1e-2, atol=2e-2)


@torch.no_grad()
@pytest.mark.parametrize("rep_kind", ["mean", "quest"])
def test_left_padded_batch_with_an_indexer_matches_each_prompt_alone(rep_kind):
    """A left-padded batch of two prompts through CISA on CUDA (k = 8, the given representative
    kind, an explicit indexer picking the first head of every KV group) gives, at every real
    position, the logits of each prompt run alone (bf16: within 3% of the logits' spread; a pad
    written to the cache or a shifted position moves them by a good part of it), and each layer's
    sequences hold only the rows' own tokens."""
    model = model_of("llama-3.2-1b", layers=2)
    hq, hkv = 32, 8
    name = f"cisa_gpu_pad_{rep_kind}"
    ct.register(name, budget=8, window=4, qshare=16, rep_kind=rep_kind,
                indexer={(layer, g): g * (hq // hkv) for layer in range(2) for g in range(hkv)})
    model.set_attn_implementation(name)
    lens = (900, 610)
    prompts = [prompt(1, n, seed=30 + i)[0] for i, n in enumerate(lens)]
    T = max(lens)
    ids = torch.zeros(2, T, dtype=torch.long, device="cuda")
    mask = torch.zeros(2, T, dtype=torch.long, device="cuda")
    for r, p in enumerate(prompts):
        ids[r, T - len(p):], mask[r, T - len(p):] = p, 1
    # Positions as generate() gives them: each row's first token at 0.
    batch = model(ids, attention_mask=mask,
                  position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits.float()
    for m in model.modules():
        if hasattr(m, "_cisa_cache"):
            assert m._cisa_cache.pad == [0, 290] and m._cisa_cache.seq_lens() == list(lens)
    for r, p in enumerate(prompts):
        alone = model(p[None]).logits.float()[0]
        got = batch[r, T - len(p):]
        spread = float(alone.max() - alone.min())
        assert float((got - alone).abs().max()) <= 0.03 * spread
