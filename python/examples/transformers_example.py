"""A transformers model run dense (SDPA) and with CISA (docs/python.md). The model is built from
a small Llama config with random weights (this machine loads nothing from a hub); pass a
checkpoint path to run a real one: python transformers_example.py /path/to/llama-or-qwen2.
The CISA runs pass cisa.transformers.Cache(model), which keeps no keys or values (the layers'
paged caches are the one copy); the SDPA run uses transformers' DynamicCache."""

import inspect
import sys
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

import cisa.transformers

cisa.transformers.register("cisa", budget=16, window=4, qshare=16)       # k = 16 pages
cisa.transformers.register("cisa_full", budget=10**6, window=4, qshare=16)

if len(sys.argv) > 1:
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
else:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=8192, initializer_range=0.2)
    model = AutoModelForCausalLM.from_config(config)
model.eval()
# transformers 5.24 takes the cache as `cache=`; 5.17 and older as `past_key_values=`.
FORWARD = inspect.signature(type(model).forward).parameters
CACHE_KW = "cache" if "cache" in FORWARD else "past_key_values"
ids = torch.randint(0, model.config.vocab_size, (1, 2000), generator=torch.Generator().manual_seed(0))


def kv_mib(cache):
    """MiB of keys and values held by transformers' cache object."""
    held = [t for layer in cache.layers for t in (layer.keys, layer.values) if t is not None]
    return sum(t.numel() * t.element_size() for t in held) / 2**20


for impl in ("sdpa", "cisa_full", "cisa"):
    model.set_attn_implementation(impl)
    cache = DynamicCache(config=model.config) if impl == "sdpa" else cisa.transformers.Cache(model)
    t0 = time.time()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                             do_sample=False, **{CACHE_KW: cache})
    line = f"{impl:9s} {out[0, ids.shape[1]:].tolist()}  {time.time() - t0:.1f} s"
    line += f"  K/V in transformers' cache {kv_mib(cache):.1f} MiB"
    if impl != "sdpa":
        read, dense = cisa.transformers.stats(model)
        line += f"  pages read {read} of {dense} ({read / dense:.1%})"
    print(line)
