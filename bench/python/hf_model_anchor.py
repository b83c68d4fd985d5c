#!/usr/bin/env python3
"""PyTorch/transformers anchor for `cisa bench model --synthetic NAME` (docs/bench-model.md).

The same fixed-output protocol on the same synthetic shape: a LlamaConfig / Qwen2Config built in
code (no downloads), random bf16 weights on the GPU, attn_implementation="sdpa", greedy decoding,
EOS ignored. For each (batch B, context L) in the grid:

  prompt   B random L-token prompts prefilled in chunks of --prefill-chunk tokens per sequence
           (all B sequences in each forward call, logits of the last row only); the first token
           is the argmax of the last chunk's logits. TTFT = the whole prefill, CUDA events.
  random   no prefill: every layer's cache is filled with L tokens of random bf16 K/V (like
           `cisa bench model --fill random`); TTFT is not measured.

then T - 1 (prompt) or T (random) one-token decode steps of all B sequences, each feeding the
argmax of the step before. decode tok/s = B * steps / decode time (CUDA events around the loop).
The cache is transformers' DynamicCache (what generate() uses by default), so each step appends
with torch.cat: that cost is part of what this anchor measures.

Prints one JSON line per (batch, context) to stdout, flushed as soon as it is known; a
configuration that runs out of memory or past --time-limit prints a line with "error".

    python3 bench/python/hf_model_anchor.py --model qwen2.5-7b --batch 1 16 \
        --context 4096 32768 --tokens 32 --fill prompt
"""
import argparse
import datetime
import gc
import json
import sys
import time

# Synthetic shapes: the published configurations of the models (hidden sizes, heads, vocabulary);
# the names are those of cisa's Model::load_synthetic.
SHAPES = {
    "llama-3.1-8b": dict(arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128, rope_theta=500000.0, rms_norm_eps=1e-5, tie=False),
    "qwen2.5-7b": dict(arch="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6, tie=False),
    "tiny-llama": dict(arch="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5, tie=True),
}


def kv_bytes_per_token(s):
    return 2 * s["num_hidden_layers"] * s["num_key_value_heads"] * s["head_dim"] * 2  # bf16


def build_model(name, max_positions, torch, transformers):
    s = SHAPES[name]
    common = dict(vocab_size=s["vocab_size"], hidden_size=s["hidden_size"],
                  intermediate_size=s["intermediate_size"], num_hidden_layers=s["num_hidden_layers"],
                  num_attention_heads=s["num_attention_heads"],
                  num_key_value_heads=s["num_key_value_heads"], rope_theta=s["rope_theta"],
                  rms_norm_eps=s["rms_norm_eps"], max_position_embeddings=max_positions,
                  tie_word_embeddings=s["tie"], use_cache=True)
    if s["arch"] == "qwen2":
        cfg = transformers.Qwen2Config(**common)
    else:
        cfg = transformers.LlamaConfig(head_dim=s["head_dim"], **common)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        try:
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
        except TypeError:  # transformers before the dtype= spelling
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    return model, cfg


def elapsed_ms(torch, fn):
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    out = fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b), out


def warm_up(model, s, batch, torch, transformers):
    """An untimed 16-token prefill and 3 decode steps at this batch size (kernel selection,
    allocator growth), on a cache that is then dropped."""
    cache = transformers.DynamicCache()
    ids = torch.randint(0, s["vocab_size"], (batch, 16), device="cuda")
    with torch.inference_mode():
        for p0, n in ((0, 16), (16, 1), (17, 1), (18, 1)):
            pos = torch.arange(p0, p0 + n, device="cuda")
            model(input_ids=ids[:, :n], past_key_values=cache, position_ids=pos.unsqueeze(0).expand(batch, -1),
                  cache_position=pos, use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()
    del cache


def run_one(model, cfg, name, batch, context, tokens, fill, chunk, seed, torch, transformers):
    s = SHAPES[name]
    dev = "cuda"
    warm_up(model, s, batch, torch, transformers)
    g = torch.Generator(device=dev).manual_seed(seed)
    cache = transformers.DynamicCache()
    torch.cuda.reset_peak_memory_stats()
    ttft_ms = None
    with torch.inference_mode():
        if fill == "prompt":
            prompt = torch.randint(0, s["vocab_size"], (batch, context), device=dev, generator=g)

            def prefill():
                logits = None
                for c0 in range(0, context, chunk):
                    c1 = min(context, c0 + chunk)
                    pos = torch.arange(c0, c1, device=dev)
                    out = model(input_ids=prompt[:, c0:c1], past_key_values=cache,
                                position_ids=pos.unsqueeze(0).expand(batch, -1),
                                cache_position=pos, use_cache=True, logits_to_keep=1)
                    logits = out.logits
                return logits[:, -1].argmax(-1)

            ttft_ms, nxt = elapsed_ms(torch, prefill)
            steps = tokens - 1
        else:
            kvh, hd = s["num_key_value_heads"], s["head_dim"]
            for layer in range(s["num_hidden_layers"]):
                k = torch.randn(batch, kvh, context, hd, device=dev, dtype=torch.bfloat16, generator=g)
                v = torch.randn(batch, kvh, context, hd, device=dev, dtype=torch.bfloat16, generator=g)
                cache.update(k, v, layer)
                del k, v
            nxt = torch.randint(0, s["vocab_size"], (batch,), device=dev, generator=g)
            steps = tokens
        torch.cuda.synchronize()

        def decode():
            t = nxt
            for i in range(steps):
                p = context + i
                pos = torch.full((batch, 1), p, device=dev, dtype=torch.long)
                out = model(input_ids=t.view(batch, 1), past_key_values=cache, position_ids=pos,
                            cache_position=torch.tensor([p], device=dev), use_cache=True,
                            logits_to_keep=1)
                t = out.logits[:, -1].argmax(-1)  # greedy; EOS is never checked
            return t

        decode_ms, _ = elapsed_ms(torch, decode) if steps > 0 else (0.0, None)
    rec = {
        "anchor": "transformers-sdpa", "model": name, "weights": "synthetic (random bf16), speed only",
        "batch": batch, "context": context, "tokens": tokens, "fill": fill,
        "decode_steps": steps, "decode_ms": decode_ms,
        "decode_step_ms": decode_ms / steps if steps else None,
        "decode_tok_s": batch * steps / (decode_ms * 1e-3) if steps and decode_ms > 0 else None,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
        "kv_bytes_per_token": kv_bytes_per_token(s), "cache": "DynamicCache",
    }
    if fill == "prompt":
        total_s = (ttft_ms + decode_ms) * 1e-3
        rec.update(ttft_ms=ttft_ms, prefill_chunk=chunk, prefill_tok_s=batch * context / (ttft_ms * 1e-3),
                   total_tok_s=batch * (context + tokens) / total_s)
    else:
        rec["ttft_ms"] = None
        rec["ttft_note"] = "not measured: the cache was filled with random K/V (no prefill)"
    del cache
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-7b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--context", type=int, nargs="+", default=[4096])
    ap.add_argument("--tokens", type=int, default=32, help="tokens each request generates (T)")
    ap.add_argument("--fill", choices=["prompt", "random"], default="prompt")
    ap.add_argument("--prefill-chunk", type=int, default=4096, help="prompt tokens per sequence per forward")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--time-limit", type=float, default=540.0,
                    help="seconds; configurations that would start after this are skipped")
    ap.add_argument("--max-kv-gib", type=float, default=120.0,
                    help="skip configurations whose K/V cache alone exceeds this (GiB)")
    a = ap.parse_args()
    if a.tokens < 1 or a.prefill_chunk < 1 or min(a.batch) < 1 or min(a.context) < 1:
        ap.error("--tokens, --prefill-chunk, --batch and --context must be >= 1")
    try:
        import torch
        import transformers
    except ImportError as e:
        print(json.dumps({"anchor": "transformers-sdpa", "error": f"cannot import: {e}"}), flush=True)
        return 1
    if not torch.cuda.is_available():
        print(json.dumps({"anchor": "transformers-sdpa", "error": "no CUDA device"}), flush=True)
        return 1
    t_start = time.time()
    max_pos = max(131072, max(a.context) + a.tokens + 1)
    model, cfg = build_model(a.model, max_pos, torch, transformers)
    header = {"anchor": "transformers-sdpa", "header": True, "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "transformers": transformers.__version__,
              "cuda": torch.version.cuda, "command": " ".join(sys.argv),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "build_s": time.time() - t_start,
              "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
    print(json.dumps(header), flush=True)
    s = SHAPES[a.model]
    for b in a.batch:
        for L in a.context:
            base = {"anchor": "transformers-sdpa", "model": a.model, "batch": b, "context": L,
                    "tokens": a.tokens, "fill": a.fill}
            kv_gib = b * (L + a.tokens) * kv_bytes_per_token(s) / 2**30
            if kv_gib > a.max_kv_gib:
                print(json.dumps({**base, "error": f"skipped: K/V cache {kv_gib:.1f} GiB > --max-kv-gib"}), flush=True)
                continue
            if time.time() - t_start > a.time_limit:
                print(json.dumps({**base, "error": "skipped: past --time-limit"}), flush=True)
                continue
            t0 = time.time()
            try:
                rec = run_one(model, cfg, a.model, b, L, a.tokens, a.fill, a.prefill_chunk, a.seed,
                              torch, transformers)
                rec["wall_s"] = time.time() - t0
                print(json.dumps(rec), flush=True)
            except torch.OutOfMemoryError as e:
                print(json.dumps({**base, "error": "out of memory: " + str(e).split("\n")[0][:200]}), flush=True)
            gc.collect()  # the failed run's cache is held by the traceback until here
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
