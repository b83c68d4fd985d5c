"""CISA as a transformers attention backend: Llama, Qwen2 and Gemma 3 models from small random
configs generate the same greedy tokens with full-budget CISA as with SDPA, with transformers'
DynamicCache and with cisa.transformers.Cache (which keeps no keys or values)."""

import inspect

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


def cache_kw(model, cache):
    """The keyword a forward or generate() takes the cache by: ``cache`` where the model's forward
    names it so (transformers 5.24), else ``past_key_values`` (5.17, deprecated in 5.24)."""
    params = inspect.signature(type(model).forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}


def generate(model, impl, ids, n=16, cache=None):
    model.set_attn_implementation(impl)
    kw = {} if cache is None else cache_kw(model, cache)
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                              do_sample=False, **kw)


def tensors_in(obj, seen=None):
    """The tensors reachable from ``obj`` through attributes, lists, tuples and dicts (weak
    references are not followed): a cache's own K/V storage."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = list(vars(obj).values())
    else:
        return []
    return [t for item in items for t in tensors_in(item, seen)]


def assert_no_kv(cache, model, length):
    """cisa.transformers.Cache after generate: no tensors at all (its layers' keys and values
    are None), the sequence length transformers needs, and the attention modules' paged caches
    as the one copy of K/V."""
    assert isinstance(cache, ct.Cache) and len(cache.layers) == model.config.num_hidden_layers
    assert all(layer.keys is None and layer.values is None for layer in cache.layers)
    assert tensors_in(cache) == []
    assert cache.get_seq_length() == length
    assert all(m._cisa_cache.len == length for m in model.modules() if hasattr(m, "_cisa_cache"))


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


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_cisa_cache_keeps_no_kv_and_generates_the_sdpa_tokens(kind):
    model = model_of(kind)
    ids = torch.randint(0, 512, (2, 700), generator=torch.Generator().manual_seed(1))
    ref = generate(model, "sdpa", ids)
    dynamic = transformers.DynamicCache(config=model.config)
    assert generate(model, "cisa_full", ids, cache=dynamic).tolist() == ref.tolist()
    # transformers' own cache holds every position's keys and values beside the paged caches.
    held = sum(t.numel() for t in tensors_in(dynamic))
    assert held == 2 * 2 * 2 * 2 * 715 * 32  # layers, K and V, rows, KV heads, positions, d
    cache = ct.Cache(model)
    assert generate(model, "cisa_full", ids, cache=cache).tolist() == ref.tolist()
    assert_no_kv(cache, model, 715)
    read, dense = ct.stats(model)
    assert read == dense > 2 * 2 * 700


def test_cisa_cache_small_budget_reads_fewer_pages():
    model = model_of("llama")
    ids = torch.randint(0, 512, (1, 900), generator=torch.Generator().manual_seed(2))
    cache = ct.Cache(model)
    out = generate(model, "cisa_small", ids, cache=cache)
    assert out.shape == (1, 916)
    assert_no_kv(cache, model, 915)
    read, dense = ct.stats(model)
    assert read < dense / 2
    # The same tokens as with transformers' DynamicCache (the same positions, the same pages).
    assert generate(model, "cisa_small", ids).tolist() == out.tolist()
    assert ct.stats(model) == (read, dense)


def test_cisa_cache_forward_steps_crop_and_continue():
    """Forward calls with a Cache: prefill, decode steps, crop(-3) and the same steps again give
    the logits of the same steps with DynamicCache; a second generate() continues the cache."""
    model = model_of("llama")
    model.set_attn_implementation("cisa_full")
    ids = torch.randint(0, 512, (2, 60), generator=torch.Generator().manual_seed(5))

    def steps(cache):
        with torch.no_grad():
            out = [model(ids[:, :50], **cache_kw(model, cache), use_cache=True).logits[:, -1]]
            out += [model(ids[:, t:t + 1], **cache_kw(model, cache), use_cache=True).logits[:, -1]
                    for t in range(50, 60)]
        return torch.stack(out)

    ref = steps(transformers.DynamicCache(config=model.config))
    cache = ct.Cache(model)
    torch.testing.assert_close(steps(cache), ref, rtol=1e-4, atol=1e-4)
    cache.crop(-3)
    assert cache.get_seq_length() == 57
    with torch.no_grad():
        again = [model(ids[:, t:t + 1], **cache_kw(model, cache), use_cache=True).logits[:, -1]
                 for t in range(57, 60)]
    torch.testing.assert_close(torch.stack(again), ref[-3:], rtol=1e-4, atol=1e-4)
    assert_no_kv(cache, model, 60)
    # generate() with the filled cache: only the new tokens are run, after position 60.
    first = generate(model, "cisa_full", ids, n=4)
    cache = ct.Cache(model)
    generate(model, "cisa_full", ids[:, :40], n=1, cache=cache)  # 40 positions (the last token
    assert cache.get_seq_length() == 40                           # generated is not run)
    assert generate(model, "cisa_full", ids, n=4, cache=cache).tolist() == first.tolist()
    assert_no_kv(cache, model, 63)


def test_cisa_cache_needs_cisa_attention():
    model = model_of("llama")
    ids = torch.randint(0, 512, (1, 40))
    with pytest.raises(ValueError, match="needs a cisa attention function"):
        generate(model, "sdpa", ids, cache=ct.Cache(model))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, -5:] = 0  # right padding: refused
    model.set_attn_implementation("cisa_full")
    cache = ct.Cache(model)
    with torch.no_grad():
        with pytest.raises(ValueError, match="only left padding"):
            model(ids.expand(2, -1), attention_mask=mask, **cache_kw(model, cache), use_cache=True)
        # The failed call's keys never reached a paged cache: the cache says so until reset.
        with pytest.raises(RuntimeError, match="did not take the keys"):
            model(ids, **cache_kw(model, cache), use_cache=True)
        cache.reset()
        model(ids, **cache_kw(model, cache), use_cache=True)
    assert_no_kv(cache, model, 40)


def test_right_padding_is_refused():
    model = model_of("llama")
    ids = torch.randint(0, 512, (2, 40))
    model.set_attn_implementation("cisa_full")
    for where in (slice(35, 40), slice(10, 12)):  # pads after a row's tokens, or inside them
        mask = torch.ones_like(ids)
        mask[1, where] = 0
        with pytest.raises(ValueError, match="only left padding"):
            with torch.no_grad():
                model(ids, attention_mask=mask)
    # A left-padded prefill, then a decode step whose mask adds a pad: refused too.
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    with torch.no_grad():
        out = model(ids, attention_mask=mask, use_cache=True)
        step = torch.cat([mask, torch.tensor([[1], [0]])], 1)
        with pytest.raises(ValueError, match="padding is on the left"):
            model(ids[:, :1], attention_mask=step, **cache_kw(model, out.past_key_values))


def left_padded(prompts):
    """The prompts as one left-padded batch, as a tokenizer with padding_side='left' makes it:
    (ids, attention_mask)."""
    n = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), n, dtype=torch.long)
    mask = torch.zeros(len(prompts), n, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, n - len(p):] = p
        mask[r, n - len(p):] = 1
    return ids, mask


def generate_batch(model, impl, ids, mask, n=12, cache=None):
    model.set_attn_implementation(impl)
    kw = {} if cache is None else cache_kw(model, cache)
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                              pad_token_id=0, **kw)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("with_cache", [False, True])
def test_left_padded_batch_generates_each_prompts_tokens(kind, with_cache):
    """Three prompts of different lengths, left-padded into one batch: with full-budget CISA
    each row generates the tokens its prompt generates alone (SDPA, batch of one, no padding),
    and the pads never reach a paged cache: each row's sequence holds its own tokens only."""
    model = model_of(kind)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, 512, (n,), generator=g) for n in (300, 170, 233)]
    alone = [generate(model, "sdpa", p[None], n=12)[0, len(p):].tolist() for p in prompts]
    ids, mask = left_padded(prompts)
    cache = ct.Cache(model) if with_cache else None
    out = generate_batch(model, "cisa_full", ids, mask, cache=cache)
    assert [row[ids.shape[1]:] for row in out.tolist()] == alone
    assert generate_batch(model, "sdpa", ids, mask)[:, ids.shape[1]:].tolist() == alone
    for m in model.modules():
        if hasattr(m, "_cisa_cache"):
            c = m._cisa_cache
            assert c.pad == [0, 130, 67] and c.seq_lens() == [311, 181, 244]
    read, dense = ct.stats(model)
    # Each row's positions alone: its own pages only, 12 steps (11 decode calls after prefill).
    own = sum(t // 16 + 1 for p in prompts for t in range(len(p) + 11))
    assert read == dense == 2 * own  # two layers
    if with_cache:
        assert_no_kv(cache, model, 311)


def test_left_padded_batch_small_budget_equals_each_prompt_alone():
    """With a budget that selects (k = 8), each padded row selects and attends exactly what its
    prompt does alone with CISA: the same tokens and the same pages read."""
    model = model_of("llama")
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(1, 512, (n,), generator=g) for n in (500, 410)]
    alone, reads = [], 0
    for p in prompts:
        alone.append(generate(model, "cisa_small", p[None], n=8)[0, len(p):].tolist())
        reads += ct.stats(model)[0]
    ids, mask = left_padded(prompts)
    out = generate_batch(model, "cisa_small", ids, mask, n=8)
    assert [row[ids.shape[1]:] for row in out.tolist()] == alone
    read, dense = ct.stats(model)
    assert read == reads < 0.75 * dense  # k = 8 selects: fewer pages than dense


def test_gemma3_left_padded_batch_generates_each_prompts_tokens():
    """Gemma 3's sliding-window layers with left padding: each row's window counts its own
    positions."""
    model = gemma3()
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(1, 512, (n,), generator=g) for n in (100, 61)]
    alone = [generate(model, "sdpa", p[None], n=12)[0, len(p):].tolist() for p in prompts]
    ids, mask = left_padded(prompts)
    out = generate_batch(model, "cisa_full", ids, mask)
    assert [row[ids.shape[1]:] for row in out.tolist()] == alone
    read_s, dense_s = ct.stats(model, layers="sliding")
    window = sum(t // 16 - max(0, t - 31) // 16 + 1 for p in prompts for t in range(len(p) + 11))
    assert read_s == dense_s == 2 * window  # two sliding layers


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


def test_gemma3_cisa_cache_keeps_no_kv_and_generates_the_sdpa_tokens():
    model = gemma3()
    ids = torch.randint(0, 512, (2, 100), generator=torch.Generator().manual_seed(3))
    ref = generate(model, "sdpa", ids, n=20)
    cache = ct.Cache(model)
    assert cache.is_sliding == [True, False, True, False]
    assert generate(model, "cisa_full", ids, n=20, cache=cache).tolist() == ref.tolist()
    assert_no_kv(cache, model, 119)
    read, dense = ct.stats(model, layers="global")
    assert read == dense == 2 * 2 * sum(t // 16 + 1 for t in range(119))
    read_s, dense_s = ct.stats(model, layers="sliding")
    window = sum(t // 16 - max(0, t - 31) // 16 + 1 for t in range(119))
    assert read_s == dense_s == 2 * 2 * window
    # The mask sizes are DynamicCache's: its sliding layers keep the last 31 positions.
    dynamic = transformers.DynamicCache(config=model.config)
    generate(model, "cisa_full", ids, n=20, cache=dynamic)
    assert [cache.get_mask_sizes(1, i) for i in range(4)] == \
        [dynamic.get_mask_sizes(1, i) for i in range(4)] == [(32, 88), (120, 0)] * 2


def test_gemma3_cisa_cache_small_budget_reads_fewer_pages_on_global_layers():
    model = gemma3()
    ids = torch.randint(0, 512, (1, 900), generator=torch.Generator().manual_seed(4))
    cache = ct.Cache(model)
    out = generate(model, "cisa_small", ids, n=20, cache=cache)
    assert out.shape == (1, 920)
    assert_no_kv(cache, model, 919)
    read, dense = ct.stats(model, layers="global")
    assert read < dense / 2
    read_s, dense_s = ct.stats(model, layers="sliding")
    assert read_s == dense_s < dense / 4
    assert generate(model, "cisa_small", ids, n=20).tolist() == out.tolist()


def test_quest_representatives_in_the_backend():
    """rep_kind="quest": every layer's paged cache keeps Quest's per-channel min and max of
    each full page's keys (what the selection scores), full budget gives SDPA's tokens, and
    k = 8 selects fewer pages."""
    ct.register("cisa_quest_full", budget=10**6, window=8, qshare=16, rep_kind="quest")
    ct.register("cisa_quest_small", budget=8, window=4, qshare=16, rep_kind="quest")
    model = model_of("llama")
    ids = torch.randint(0, 512, (1, 900), generator=torch.Generator().manual_seed(2))
    assert generate(model, "cisa_quest_full", ids, n=6).tolist() == \
        generate(model, "sdpa", ids, n=6).tolist()
    out = generate(model, "cisa_quest_small", ids, n=6)
    read, dense = ct.stats(model)
    assert read < dense / 2
    for m in model.modules():
        if hasattr(m, "_cisa_cache"):
            c = m._cisa_cache
            full = c.len // 16  # row 0's pages 0 .. full - 1 are full
            keys = c.k[:full]  # [pages, H, 16, d]
            want = torch.cat([keys.min(2).values, keys.max(2).values], -1)
            assert c.reps.shape[-1] == 2 * keys.shape[-1]
            assert torch.equal(c.reps[:full], want)
    assert out.shape == (1, 906)


@pytest.mark.parametrize("rep_kind", ["mean", "quest"])
def test_left_padded_forward_equals_each_prompt_alone(rep_kind):
    """A forward of a left-padded batch (positions as generate() gives them) with k = 8, the
    representative kind and an explicit indexer gives every real position of each row the
    logits of its prompt alone."""
    name = f"cisa_pad_{rep_kind}"
    ct.register(name, budget=8, window=4, qshare=16, rep_kind=rep_kind,
                indexer={(layer, g): 2 * g + 1 for layer in range(2) for g in range(2)})
    model = model_of("llama")
    model.set_attn_implementation(name)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 512, (n,), generator=g) for n in (900, 610)]
    ids, mask = left_padded(prompts)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask,
                      position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        for r, p in enumerate(prompts):
            alone = model(p[None]).logits[0]
            torch.testing.assert_close(batch[r, ids.shape[1] - len(p):], alone, rtol=1e-4,
                                       atol=1e-4)
