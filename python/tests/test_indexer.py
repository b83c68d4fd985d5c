"""Calibrated indexers: the .cisaidx reader against the tables `cisa calibrate` printed when it
wrote the committed files, and the transformers backend's index query from a chosen head against
a direct computation of that head's query (projection and RoPE) and the selection it gives; the
fitted mix of a group's heads (version 2, cisa calibrate --fit) against the projection it stands
for, Sum_h A_h W_q^(h), applied before RoPE."""

import pathlib
import re
import struct

import pytest
import torch

import cisa
from cisa import indexer as ix
from helpers import fitted_indexer

ROOT = pathlib.Path(__file__).resolve().parents[2]
INDEXERS = ROOT / "indexers"
# (n_layer, n_embd, n_head, n_head_kv, head_dim) of the GGUF models the files were made for.
SHAPES = {"gemma3-270m": ("gemma3", 18, 640, 4, 1, 256),
          "smollm2-135m": ("llama", 30, 576, 9, 3, 64),
          "smollm2-135m-fit": ("llama", 30, 576, 9, 3, 64)}  # version 2, cisa calibrate --fit


def printed_table(name):
    """What `cisa calibrate` printed (indexers/NAME.calibration.txt): settings, and per group
    (layer, group, n, oracle, [(head or -1, kl, captured)], chosen index)."""
    text = (INDEXERS / f"{name}.calibration.txt").read_text()
    m = re.search(r"criterion (\w+), k = (\d+) chunks, W = (\d+) pages, (\d+) sink pages", text)
    settings = (m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)))
    groups = []
    for line in text.splitlines():
        g = re.match(r"layer\s+(\d+) group (\d+)\s+n=(\d+)\s+oracle ([\d.]+) \|(.*)", line)
        if not g:
            continue
        cands = re.findall(r"(\*?)(h\d+|mean|fit)\s+([\d.]+)/([\d.]+)", g.group(5))
        code = {"mean": ix.MEAN, "fit": ix.FIT}
        groups.append((int(g.group(1)), int(g.group(2)), int(g.group(3)), float(g.group(4)),
                       [(code[h] if h in code else int(h[1:]), float(kl), float(c))
                        for _, h, kl, c in cands],
                       [star for star, *_ in cands].index("*")))
    return settings, groups


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_committed_indexers_read_as_calibrate_printed_them(name):
    idx = ix.load_indexer(INDEXERS / f"{name}.cisaidx")
    assert (idx.arch, idx.n_layer, idx.n_embd, idx.n_head, idx.n_head_kv, idx.head_dim) == \
        SHAPES[name]
    (criterion, k, W, sinks), groups = printed_table(name)
    assert (idx.criterion, idx.budget, idx.window, idx.sink_pages) == (criterion, k, W, sinks)
    assert len(idx.documents) == (4 if idx.fit else 8) and idx.page_size == 16
    assert idx.fit == name.endswith("-fit")
    assert len(idx.groups) == len(groups) > 0
    for g, (layer, group, n, oracle, cands, chosen) in zip(idx.groups, groups):
        assert (g.layer, g.kv_group, g.positions, g.chosen) == (layer, group, n, chosen)
        assert round(g.oracle, 4) == oracle
        assert [(c.head, round(c.kl, 4), round(c.captured, 4)) for c in g.candidates] == cands
        want = {ix.MEAN: None, ix.FIT: "fit"}.get(cands[chosen][0], cands[chosen][0])
        assert g.head == want
        assert len(g.mix) == (idx.n_head // idx.n_head_kv * idx.head_dim if idx.fit else 0)
    assert len(idx.heads()) == len(groups)


def test_corrupted_truncated_and_foreign_files_are_refused():
    data = (INDEXERS / "gemma3-270m.cisaidx").read_bytes()
    ix.parse_indexer(data)
    for i in range(len(data)):  # every byte flipped
        bad = bytearray(data)
        bad[i] ^= 0x5A
        with pytest.raises(ValueError, match="indexer file|bad magic"):
            ix.parse_indexer(bytes(bad))
    for n in range(len(data)):  # every truncation
        with pytest.raises(ValueError):
            ix.parse_indexer(data[:n])
    with pytest.raises(ValueError, match="version 3 is not supported"):
        ix.parse_indexer(data[:8] + struct.pack("<I", 3) + data[12:])
    # Contents that contradict themselves, under a correct payload hash: the chosen candidate
    # of the last group out of range.
    payload = bytearray(data[32:])
    payload[-4:] = struct.pack("<i", 7)
    forged = data[:24] + struct.pack("<Q", ix.fnv1a64(bytes(payload))) + bytes(payload)
    with pytest.raises(ValueError, match="chosen candidate 7 out of range"):
        ix.parse_indexer(forged)
    with pytest.raises(ValueError, match="cannot open indexer file"):
        ix.load_indexer(INDEXERS / "missing.cisaidx")


DATA = pathlib.Path(__file__).resolve().parent / "data"


def test_version_2_files_written_by_the_cpp_writer():
    """Version 2 (cisa calibrate --fit) as the C++ writer makes it (data/make_indexer_v2.cpp):
    without a fit, the same indexer as the version-1 file; with one, the fit candidate and its
    h_g x head_dim coefficients per group, chosen for the first group."""
    v1 = ix.load_indexer(INDEXERS / "gemma3-270m.cisaidx")
    v2 = ix.load_indexer(DATA / "gemma3-270m-v2.cisaidx")
    assert (DATA / "gemma3-270m-v2.cisaidx").read_bytes()[8:12] == struct.pack("<I", 2)
    assert not v2.fit and v2.fit_ridge == 0.05
    for a, b in zip(v1.groups, v2.groups):
        assert a == b and b.mix == []
    assert v2.heads() == v1.heads() and len(v2.groups) == 3
    fit = ix.load_indexer(DATA / "gemma3-270m-v2-fit.cisaidx")
    assert fit.fit and fit.fit_ridge == 0.05
    for i, g in enumerate(fit.groups):
        assert [c.head for c in g.candidates] == [0, 1, 2, 3, ix.MEAN, ix.FIT]
        # 0.001f * k in float32, as the writer computed them.
        assert g.mix == (torch.tensor(0.001) * torch.arange(4 * 256).float()).tolist()
        assert g.head == ("fit" if i == 0 else v1.groups[i].head)
    assert fit.mixes() == {(5, 0): fit.groups[0].mix} and v2.mixes() == {}
    data = (DATA / "gemma3-270m-v2-fit.cisaidx").read_bytes()
    for n in range(0, len(data), 97):
        with pytest.raises(ValueError):
            ix.parse_indexer(data[:n])
    # One coefficient too few in the last group, under a correct payload hash.
    payload = bytearray(data[32:])
    del payload[-4:]
    payload[-4 * 1023 - 4:-4 * 1023] = struct.pack("<I", 1023)
    forged = (data[:16] + struct.pack("<QQ", len(payload), ix.fnv1a64(bytes(payload))) +
              bytes(payload))
    with pytest.raises(ValueError, match="has 1023 fit coefficients"):
        ix.parse_indexer(forged)


# ---- the transformers backend ------------------------------------------------------------------

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
import cisa.transformers as ct  # noqa: E402
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: E402

SEL = dict(budget=3, window=1, qshare=4)


def llama(layers, heads, kv_heads, head_dim):
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=144, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        max_position_embeddings=2048, initializer_range=0.2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def run_capturing(model, impl, ids, monkeypatch):
    """One prefill forward. Returns every SparseAttentionWrapper.run in layer order (wrapper,
    index query, chunks it selected) and every layer's query heads after RoPE, computed directly
    from q_proj's output in the same forward and the model's rotary embedding ([layers][heads,
    T, head_dim])."""
    calls, projected = [], []
    run = cisa.SparseAttentionWrapper.run

    def recording(self, q, k, v, reps=None, index_q=None, scale=0.0):
        out = run(self, q, k, v, reps, index_q, scale)
        calls.append((self, index_q.clone(), self.chunks.clone()))
        return out

    monkeypatch.setattr(cisa.SparseAttentionWrapper, "run", recording)
    inputs = []

    def hook(m, i, o):
        inputs.append(i[0])
        projected.append(o)

    hooks = [layer.self_attn.q_proj.register_forward_hook(hook) for layer in model.model.layers]
    model.set_attn_implementation(impl)
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    monkeypatch.undo()
    T, d = ids.shape[1], model.config.head_dim
    cos, sin = model.model.rotary_emb(projected[0], torch.arange(T)[None])
    queries = []
    for q in projected:
        q = q.view(1, T, -1, d).transpose(1, 2)
        queries.append(apply_rotary_pos_emb(q, q, cos, sin)[0][0])
    return calls, queries, (inputs, cos, sin)


def fitted_query(attn, x, mix, g, hg, cos, sin):
    """The fitted index query of KV group g computed as the projection it stands for: W~ = Sum_h
    A_h W_q^(h) (and the bias likewise) in Hugging Face's layout, where RoPE's frequency-i pair
    is channels (i, i + d/2) and A_h acts on it as the complex number alpha + i beta; then x W~^T
    and RoPE (float64). Independent of the backend's apply_mix, which mixes after RoPE."""
    W = attn.q_proj.weight.double()
    d = W.shape[0] // attn.config.num_attention_heads
    half = d // 2
    A = torch.tensor(mix, dtype=torch.float64).view(hg, half, 2)
    A = torch.complex(A[..., 0], A[..., 1])  # [h_g, d/2]

    def mixed(w):  # [h_g, d, ...] rows of the group's heads -> [d, ...]
        z = (A.view(hg, half, *[1] * (w.dim() - 2)) * torch.complex(w[:, :half], w[:, half:]))
        z = z.sum(0)
        return torch.cat((z.real, z.imag))

    Wt = mixed(W.view(-1, d, W.shape[1])[g * hg:(g + 1) * hg])  # [d, E]
    q = x.double() @ Wt.T
    if attn.q_proj.bias is not None:
        q = q + mixed(attn.q_proj.bias.double().view(-1, d)[g * hg:(g + 1) * hg])
    q = q.view(1, 1, -1, d)
    return apply_rotary_pos_emb(q, q, cos.double(), sin.double())[0][0, 0].float()


def group_lists(w, chunks, kv_groups):
    """The selected chunks of every page list, grouped by KV group."""
    o = w.offsets.tolist()
    return [[chunks[o[i]:o[i + 1]].tolist() for i in range(g, len(o) - 1, kv_groups)]
            for g in range(kv_groups)]


def check_index_queries(model, impl, heads, monkeypatch, ids, mixes=None):
    """The index query of each (layer, KV group) is the chosen head's post-RoPE query (or the
    mean of the group's, or where ``heads`` says "fit" the fitted mix of ``mixes`` computed as a
    projection before RoPE), and the selection is select_pages' on that query. Returns the number
    of (layer, group) lists whose selection differs from the mean's."""
    hq, hkv = model.config.num_attention_heads, model.config.num_key_value_heads
    hg = hq // hkv
    calls, want_q, (inputs, cos, sin) = run_capturing(model, impl, ids, monkeypatch)
    assert len(calls) == model.config.num_hidden_layers
    differ = 0
    for layer, (w, iq, chunks) in enumerate(calls):
        q = want_q[layer].transpose(0, 1)  # [T, hq, d]
        mean = q.reshape(q.shape[0], hkv, hg, -1).mean(2)
        want = mean.clone()
        fitted = [g for g in range(hkv) if heads.get((layer, g)) == "fit"]
        for g in range(hkv):
            h = heads.get((layer, g))
            if h == "fit":
                want[:, g] = fitted_query(model.model.layers[layer].self_attn, inputs[layer][0],
                                          mixes[(layer, g)], g, hg, cos, sin)
            elif h is not None:
                want[:, g] = q[:, h]
        rest = [g for g in range(hkv) if g not in fitted]
        torch.testing.assert_close(iq[:, rest], want[:, rest], rtol=1e-5, atol=1e-5)
        # The fit sums h_g heads' f32 projections in another order than float64 does.
        torch.testing.assert_close(iq[:, fitted], want[:, fitted], rtol=1e-4, atol=1e-4)
        cache = model.model.layers[layer].self_attn._cisa_cache
        sel = (cache.k, cache.reps, w.block_tables, w.seq_lens, w.entries, SEL["budget"],
               SEL["window"], SEL["qshare"], 0, False, w.pages.numel(), w.num_selected.numel())
        got = group_lists(w, chunks, hkv)
        assert got == group_lists(w, cisa.select_pages(iq, *sel)[1], hkv)
        by_mean = group_lists(w, cisa.select_pages(mean.contiguous(), *sel)[1], hkv)
        for g in range(hkv):
            if heads.get((layer, g)) is None:
                assert got[g] == by_mean[g], (layer, g)
            else:
                differ += got[g] != by_mean[g]
    return differ


def test_smollm2_indexer_picks_the_calibrated_heads(monkeypatch):
    """The committed SmolLM2 indexer on a random model of SmolLM2-135M's attention shape (30
    layers, 9:3 heads, head_dim 64): every layer and KV group scores with the head the file
    chose (the mean where it chose the mean), and those selections differ from the mean's."""
    path = INDEXERS / "smollm2-135m.cisaidx"
    ct.register("cisa_smollm2_idx", indexer=path, **SEL)
    model = llama(30, 9, 3, 64)
    ids = torch.randint(0, 256, (1, 160), generator=torch.Generator().manual_seed(11))
    heads = ix.load_indexer(path).heads()
    assert sum(h is not None for h in heads.values()) > 30
    assert check_index_queries(model, "cisa_smollm2_idx", heads, monkeypatch, ids) > 10


def test_explicit_head_mapping(monkeypatch):
    heads = {(0, 0): 1, (0, 1): 2, (1, 1): 3}  # layer 1, group 0: the mean
    ct.register("cisa_mapped", indexer={**heads, (1, 0): "mean"}, **SEL)
    model = llama(2, 4, 2, 32)
    ids = torch.randint(0, 256, (1, 200), generator=torch.Generator().manual_seed(12))
    assert check_index_queries(model, "cisa_mapped", heads, monkeypatch, ids) > 0


def test_mismatched_indexers_are_refused():
    ids = torch.randint(0, 256, (1, 40))
    model = llama(2, 4, 2, 32)
    ct.register("cisa_gemma_idx", indexer=INDEXERS / "gemma3-270m.cisaidx")
    model.set_attn_implementation("cisa_gemma_idx")
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"calibrated on gemma3 'Gemma 3 270m' .*\(n_layer 18 "
                                             r"vs 2, n_head_kv 1 vs 2, head_dim 256 vs 32\)"):
            model(ids)
        ct.register("cisa_bad_head", indexer={(0, 1): 1})  # head 1 is group 0's
        model.set_attn_implementation("cisa_bad_head")
        with pytest.raises(ValueError, match=r"picks query head 1 for layer 0, KV group 1, whose "
                                             r"heads are 2 \.\. 3"):
            model(ids)
        ct.register("cisa_bad_layer", indexer={(5, 0): 0})
        model.set_attn_implementation("cisa_bad_layer")
        with pytest.raises(ValueError, match="names layer 5, KV group 0, but the model has 2"):
            model(ids)
    with pytest.raises(ValueError, match="keys must be"):
        ct.register("cisa_bad_key", indexer={0: 1})
    with pytest.raises(TypeError, match="indexer must be"):
        ct.register("cisa_bad_type", indexer=3)


def test_indexer_on_a_sliding_window_layer_is_refused():
    cfg = transformers.Gemma3TextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=32,
        sliding_window_pattern=2, max_position_embeddings=2048)
    model = transformers.Gemma3ForCausalLM(cfg).float().eval()
    assert cfg.layer_types == ["sliding_attention", "full_attention"]
    ct.register("cisa_idx_sliding", indexer={(0, 0): 1})
    model.set_attn_implementation("cisa_idx_sliding")
    with torch.no_grad(), pytest.raises(ValueError, match="layer 0, a sliding-window layer"):
        model(torch.randint(0, 256, (1, 40)))


# ---- the fitted mix (version 2, cisa calibrate --fit) --------------------------------------------

def one_head(j, hg, d):
    """Coefficients [h_g][d/2][2] that select the group's j-th head: alpha = 1 on it, 0 else."""
    return [1.0 if k // d == j and k % 2 == 0 else 0.0 for k in range(hg * d)]


def uniform(hg, d):
    """alpha = 1/h_g on every head and pair: the mean."""
    return [1.0 / hg if k % 2 == 0 else 0.0 for k in range(hg * d)]


def random_mix(hg, d, seed):
    return (torch.randn(hg * d, generator=torch.Generator().manual_seed(seed)) * 0.7).tolist()


def test_apply_mix_selects_a_head_exactly_and_averages_as_the_mean():
    """index_query on random post-RoPE queries: the fit selecting a head is that head bit for bit;
    the uniform fit is the mean; random coefficients act on Hugging Face's pairs (i, i + d/2) as
    complex numbers (checked against torch's complex product)."""
    rows, hq, hkv, d = 7, 6, 2, 32
    hg = hq // hkv
    q = torch.randn(rows, hq, d, generator=torch.Generator().manual_seed(3))
    mix = lambda c: torch.tensor(c).view(hg, d // 2, 2)  # noqa: E731
    got = ct.index_query(q, hkv, [mix(one_head(2, hg, d)), mix(one_head(0, hg, d))])
    assert torch.equal(got, torch.stack([q[:, 2], q[:, 3]], 1))
    got = ct.index_query(q, hkv, [mix(uniform(hg, d)), None])
    torch.testing.assert_close(got, q.view(rows, hkv, hg, d).mean(2))
    c = mix(random_mix(hg, d, 4))
    z = torch.complex(q[:, 3:, :d // 2].double(), q[:, 3:, d // 2:].double())  # group 1's heads
    want = (torch.complex(c[..., 0].double(), c[..., 1].double()) * z).sum(1)
    got = ct.index_query(q, hkv, [1, c])
    torch.testing.assert_close(got[:, 1], torch.cat((want.real, want.imag), -1).float())
    assert torch.equal(got[:, 0], q[:, 1])


def test_fit_selecting_one_head_or_uniform_is_that_head_or_the_mean(monkeypatch):
    """On a Llama model (2 layers, 6:2 heads, d = 32) a synthetic version-2 indexer choosing the
    fit: with alpha = 1 on one head its index queries and selection equal those of a mapping to
    that head, bit for bit; with alpha = 1/h_g everywhere they equal the mean's (default) ones."""
    model = llama(2, 6, 2, 32)
    hg, d = 3, 32
    ids = torch.randint(0, 256, (1, 200), generator=torch.Generator().manual_seed(13))
    ct.register("cisa_fit_one", indexer=fitted_indexer(2, 6, 2, 32, {
        (0, 0): one_head(1, hg, d), (0, 1): one_head(2, hg, d), (1, 0): one_head(0, hg, d),
        (1, 1): None}), **SEL)
    ct.register("cisa_fit_one_map", indexer={(0, 0): 1, (0, 1): 5, (1, 0): 0}, **SEL)
    ct.register("cisa_fit_uniform", indexer=fitted_indexer(
        2, 6, 2, 32, {(layer, g): uniform(hg, d) for layer in range(2) for g in range(2)}), **SEL)
    ct.register("cisa_fit_mean", **SEL)
    runs = {name: run_capturing(model, name, ids, monkeypatch)[0]
            for name in ("cisa_fit_one", "cisa_fit_one_map", "cisa_fit_uniform", "cisa_fit_mean")}
    for layer in range(2):
        (_, a, ca), (_, b, cb) = runs["cisa_fit_one"][layer], runs["cisa_fit_one_map"][layer]
        assert torch.equal(a, b) and torch.equal(ca, cb)
        (_, a, ca), (_, b, cb) = runs["cisa_fit_uniform"][layer], runs["cisa_fit_mean"][layer]
        torch.testing.assert_close(a, b)
        assert torch.equal(ca, cb)
    assert not torch.equal(runs["cisa_fit_one"][0][1], runs["cisa_fit_mean"][0][1])


def qwen2(layers, heads, kv_heads, head_dim):
    cfg = transformers.Qwen2Config(
        vocab_size=256, hidden_size=144, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        max_position_embeddings=2048, initializer_range=0.2)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    with torch.no_grad():  # a bias that matters (transformers initialises it to zero)
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("make", [llama, qwen2], ids=["llama", "qwen2"])
def test_fit_with_random_coefficients_is_the_mixed_projection(make, monkeypatch):
    """Random coefficients: every fitted group's index query equals (x W~^T + b~) then RoPE, with
    W~ = Sum_h A_h W_q^(h) and b~ likewise built in Hugging Face's layout (the fit commutes with
    RoPE), a chosen head and the mean as before; the selection is select_pages' on it and differs
    from the mean's."""
    model = make(2, 6, 2, 32)
    hg, d = 3, 32
    choices = {(0, 0): random_mix(hg, d, 1), (0, 1): random_mix(hg, d, 2),
               (1, 0): random_mix(hg, d, 3), (1, 1): 4}
    idx = fitted_indexer(2, 6, 2, 32, choices)
    name = f"cisa_fit_random_{make.__name__}"
    ct.register(name, indexer=idx, **SEL)
    ids = torch.randint(0, 256, (1, 200), generator=torch.Generator().manual_seed(14))
    heads, mixes = idx.heads(), idx.mixes()
    assert sorted(mixes) == [(0, 0), (0, 1), (1, 0)] and heads[(1, 1)] == 4
    assert check_index_queries(model, name, heads, monkeypatch, ids, mixes) > 0


def test_smollm2_fit_indexer_applies_its_fitted_queries(monkeypatch):
    """The committed version-2 SmolLM2 indexer (cisa calibrate --fit; the fit chosen in 85 of its
    90 groups) on a random model of SmolLM2-135M's attention shape (30 layers, 9:3 heads,
    head_dim 64): accepted, and every group's index query is its fitted projection (or its chosen
    head / the mean), the selection select_pages' on it."""
    path = INDEXERS / "smollm2-135m-fit.cisaidx"
    idx = ix.load_indexer(path)
    heads, mixes = idx.heads(), idx.mixes()
    assert sum(h == "fit" for h in heads.values()) == len(mixes) == 85
    ct.register("cisa_smollm2_fit", indexer=path, **SEL)
    model = llama(30, 9, 3, 64)
    ids = torch.randint(0, 256, (1, 96), generator=torch.Generator().manual_seed(15))
    assert check_index_queries(model, "cisa_smollm2_fit", heads, monkeypatch, ids, mixes) > 10


def gemma3(layers, heads, kv_heads, head_dim, pattern):
    cfg = transformers.Gemma3TextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        sliding_window=32, sliding_window_pattern=pattern, max_position_embeddings=2048)
    torch.manual_seed(0)
    return transformers.Gemma3ForCausalLM(cfg).float().eval()


def test_fit_on_a_model_with_qk_norms_is_refused():
    """Gemma 3 normalises each query head (q_norm) before RoPE; the fit does not commute with
    that, and cisa calibrate refuses --fit there, so a fit choice is refused at the first call:
    a synthetic indexer on a 2-layer Gemma 3, and the version-2 Gemma 3 270M file with a fit
    choice on a Gemma 3 of that attention shape (18 layers, 4:1 heads, head_dim 256), whose
    version-2 file without a fit runs."""
    ids = torch.randint(0, 256, (1, 40))
    model = gemma3(2, 4, 2, 32, 2)
    assert model.config.layer_types == ["sliding_attention", "full_attention"]
    ct.register("cisa_fit_gemma", indexer=fitted_indexer(2, 4, 2, 32, {
        (1, 0): random_mix(2, 32, 5), (1, 1): 3}, arch="gemma3"))
    model.set_attn_implementation("cisa_fit_gemma")
    with torch.no_grad(), pytest.raises(ValueError, match=r"chooses the fitted mix .* \(1, 0\), "
                                                          r"but this model has q/k norms"):
        model(ids)
    model = gemma3(18, 4, 1, 256, 6)
    ct.register("cisa_fit_gemma_270m", indexer=DATA / "gemma3-270m-v2-fit.cisaidx")
    ct.register("cisa_gemma_270m_v2", indexer=DATA / "gemma3-270m-v2.cisaidx")
    with torch.no_grad():
        model.set_attn_implementation("cisa_fit_gemma_270m")
        with pytest.raises(ValueError, match=r"\(5, 0\), but this model has q/k norms"):
            model(ids)
        model.set_attn_implementation("cisa_gemma_270m_v2")
        model(ids)
