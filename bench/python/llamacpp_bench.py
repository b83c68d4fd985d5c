#!/usr/bin/env python3
"""Times llama.cpp's prefill and decode on a GGUF model, as the anchor for `cisa bench model`.

llama.cpp comes from the same PyPI source as the conformance fixtures (llama-cpp-python, built
from source for this CPU; see tests/golden/scripts/make_llamacpp_fixtures.py for the install line). The
measurement follows llama-bench's method through llama.cpp's C API:

  prefill  the context is filled with N tokens in batches of --batch (one llama_decode call per
           batch, logits only for each batch's last token); tokens/s = N / wall time.
  decode   with those N tokens in the KV cache, --decode further tokens are fed one at a time
           (one llama_decode call each, one row of logits); tokens/s = count / wall time.

Token ids are a fixed pseudo-random sequence over the vocabulary (speed does not depend on
content). A short warm-up run precedes the timed ones; with --repeat R the median is reported.

    python3 bench/python/llamacpp_bench.py -m models/gemma-3-270m-q4_k_m.gguf --context 1024 8192 \\
        --threads 2 [--decode 64] [--repeat 3] [--json]

With --json one JSON document goes to stdout: {"anchor": "llama.cpp", "llama_cpp_python": ...,
"results": [{"context": N, "prefill_tok_s": ..., "decode_tok_s": ..., ...}, ...]}.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import pathlib
import random
import statistics
import sys
import time


def fail(msg: str) -> None:
    sys.exit("llamacpp_bench.py: " + msg)


def main() -> int:
    ap = argparse.ArgumentParser(description="llama.cpp prefill/decode tokens/s (llama-bench method)")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--context", type=int, nargs="+", default=[1024], help="prompt tokens before decoding")
    ap.add_argument("--decode", type=int, default=64, help="tokens decoded after the prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512, help="n_batch = n_ubatch")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--flash-attn", choices=["off", "on", "auto"], default="off")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="keep llama.cpp's log on stderr")
    args = ap.parse_args()

    try:
        import llama_cpp as L  # type: ignore
    except ImportError:
        fail('needs llama-cpp-python: CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36')
    path = pathlib.Path(args.model)
    if not path.exists():
        fail(f"no model file {path}")
    if min(args.context) < 1 or args.decode < 1 or args.repeat < 1 or args.threads < 1 or args.batch < 1:
        fail("--context, --decode, --repeat, --threads and --batch must be positive")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    L.llama_backend_init()
    quiet = L.llama_log_callback(lambda level, text, user: None)
    if not args.verbose:
        L.llama_log_set(quiet, ctypes.c_void_p(0))
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        fail(f"llama.cpp could not load {path}")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    n_ctx_train = L.llama_model_n_ctx_train(model)
    fa = {"off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED, "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
          "auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO}[args.flash_attn]

    rng = random.Random(0)
    results = []
    for n_prompt in args.context:
        n_ctx = n_prompt + args.decode + 1
        if n_ctx > n_ctx_train:
            fail(f"context {n_prompt} + {args.decode} decoded tokens exceeds the model's {n_ctx_train}")
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = args.batch
        cp.n_ubatch = args.batch
        cp.n_threads = args.threads
        cp.n_threads_batch = args.threads
        cp.flash_attn_type = fa
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            fail(f"llama_init_from_model failed for n_ctx={n_ctx}")
        mem = L.llama_get_memory(ctx)
        batch = L.llama_batch_init(args.batch, 0, 1)
        tokens = [rng.randrange(n_vocab) for _ in range(n_prompt + args.decode)]

        def run(chunk: list[int], start: int) -> None:
            batch.n_tokens = len(chunk)
            for i, tok in enumerate(chunk):
                batch.token[i] = tok
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1 if i == len(chunk) - 1 else 0
            rc = L.llama_decode(ctx, batch)
            if rc != 0:
                fail(f"llama_decode returned {rc} (tokens at positions {start}..{start + len(chunk) - 1}; "
                     "--verbose shows llama.cpp's reason)")

        # Warm-up: a short prompt and a few single-token steps, then an empty cache.
        run(tokens[:min(32, n_prompt)], 0)
        for i in range(4):
            run([tokens[i]], min(32, n_prompt) + i)
        L.llama_memory_clear(mem, True)

        pre, dec = [], []
        for r in range(args.repeat):
            t0 = time.perf_counter()
            for b0 in range(0, n_prompt, args.batch):
                run(tokens[b0:min(b0 + args.batch, n_prompt)], b0)
            t1 = time.perf_counter()
            for i in range(args.decode):
                run([tokens[n_prompt + i]], n_prompt + i)
            t2 = time.perf_counter()
            pre.append(n_prompt / (t1 - t0))
            dec.append(args.decode / (t2 - t1))
            log(f"context {n_prompt} run {r + 1}/{args.repeat}: prefill {pre[-1]:.1f} tok/s "
                f"({t1 - t0:.2f} s), decode {dec[-1]:.2f} tok/s ({t2 - t1:.2f} s)")
            L.llama_memory_clear(mem, True)
        results.append({
            "context": n_prompt, "decode_tokens": args.decode, "repeat": args.repeat,
            "prefill_tok_s": statistics.median(pre), "decode_tok_s": statistics.median(dec),
            "prefill_tok_s_runs": pre, "decode_tok_s_runs": dec,
        })
        L.llama_batch_free(batch)
        L.llama_free(ctx)
    L.llama_model_free(model)

    doc = {
        "anchor": "llama.cpp", "llama_cpp_python": L.__version__, "model": str(path),
        "threads": args.threads, "n_batch": args.batch, "n_ubatch": args.batch,
        "flash_attn": args.flash_attn, "kv_type": "f16",
        "system_info": L.llama_print_system_info().decode().strip(),
        "results": results,
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"llama.cpp (llama-cpp-python {L.__version__}), {path.name}, {args.threads} threads, "
              f"batch {args.batch}, flash-attn {args.flash_attn}")
        print(f"{'context':>8} {'prefill tok/s':>14} {'decode tok/s':>13}")
        for r in results:
            print(f"{r['context']:>8} {r['prefill_tok_s']:>14.1f} {r['decode_tok_s']:>13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
