"""CISA as a transformers attention backend: Llama and Qwen2 models from small random configs
generate the same greedy tokens with full-budget CISA as with SDPA."""

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
