"""CISA as a transformers attention backend: Llama, Qwen2 and Gemma 3 models from small random
configs generate the same greedy tokens with full-budget CISA as with SDPA."""

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import cisa.transformers as ct  # noqa: E402

ct.register("cisa_full", budget=10**6, window=8, qshare=16)
ct.register("cisa_small", budget=8, window=4, qshare=16)


def model_of(kind):
    common = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  initializer_range=0.2)
    cfg = (transformers.LlamaConfig if kind == "llama" else transformers.Qwen2Config)(**common)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()


def generate(model, impl, ids, n=16):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                              do_sample=False)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_full_budget_cisa_generates_the_sdpa_tokens(kind):
    model = model_of(kind)
    ids = torch.randint(0, 512, (2, 700), generator=torch.Generator().manual_seed(1))
    ref = generate(model, "sdpa", ids)
    full = generate(model, "cisa_full", ids)
    assert full.tolist() == ref.tolist()
    read, dense = ct.stats(model)
    # Two layers, two rows, 700 prefill positions and 15 decode steps, all through CISA.
    assert read == dense > 2 * 2 * 700


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_small_budget_reads_fewer_pages(kind):
    model = model_of(kind)
    ids = torch.randint(0, 512, (1, 900), generator=torch.Generator().manual_seed(2))
    out = generate(model, "cisa_small", ids)
    assert out.shape == (1, 916)
    read, dense = ct.stats(model)
    assert read < dense / 2


def test_padding_is_refused():
    model = model_of("llama")
    ids = torch.randint(0, 512, (2, 40))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    model.set_attn_implementation("cisa_full")
    with pytest.raises(ValueError, match="without padding"):
        with torch.no_grad():
            model(ids, attention_mask=mask)


def gemma3():
    """Gemma 3 text model: sliding-window layers 0 and 2 (window 32, two pages), global layers 1
    and 3, q/k norms, scaling query_pre_attn_scalar ** -0.5 (not head_dim's), 4 query heads on 2
    KV heads."""
    cfg = transformers.Gemma3TextConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=48,
        sliding_window=32, sliding_window_pattern=2, max_position_embeddings=4096,
        initializer_range=0.2)
    assert cfg.layer_types == ["sliding_attention", "full_attention"] * 2
    torch.manual_seed(0)
    return transformers.Gemma3ForCausalLM(cfg).float().eval()


def test_gemma3_full_budget_cisa_generates_the_sdpa_tokens():
    model = gemma3()
    ids = torch.randint(0, 512, (2, 100), generator=torch.Generator().manual_seed(3))
    ref = generate(model, "sdpa", ids, n=20)
    assert generate(model, "eager", ids, n=20).tolist() == ref.tolist()
    full = generate(model, "cisa_full", ids, n=20)
    assert full.tolist() == ref.tolist()
    read, dense = ct.stats(model, layers="global")
    # Two global layers, two rows, 100 prefill positions and 19 decode steps.
    assert read == dense == 2 * 2 * sum(t // 16 + 1 for t in range(119))
    read_s, dense_s = ct.stats(model, layers="sliding")
    # The sliding layers read the pages holding t - 32 < s <= t: two or three of them.
    window = sum(t // 16 - max(0, t - 31) // 16 + 1 for t in range(119))
    assert read_s == dense_s == 2 * 2 * window
    assert ct.stats(model) == (read + read_s, dense + dense_s)
    caches = [layer.self_attn._cisa_cache for layer in model.model.layers]
    assert [c.sliding for c in caches] == [32, 0, 32, 0] and all(c.len == 119 for c in caches)


def test_gemma3_small_budget_reads_fewer_pages_on_global_layers():
    model = gemma3()
    ids = torch.randint(0, 512, (1, 900), generator=torch.Generator().manual_seed(4))
    out = generate(model, "cisa_small", ids, n=20)
    assert out.shape == (1, 920)
    read, dense = ct.stats(model, layers="global")
    assert read < dense / 2
    read_s, dense_s = ct.stats(model, layers="sliding")
    assert read_s == dense_s < dense / 4
