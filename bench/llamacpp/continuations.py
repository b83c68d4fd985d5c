#!/usr/bin/env python3
"""Greedy continuations: llama.cpp (llama-cpp-python's Llama, its defaults, temperature 0) against
`cisa run --greedy` with --llamacpp-numerics and with the default numerics, on the prompts that
bench/llamacpp/prompts.py writes.

    python3 bench/llamacpp/continuations.py --cisa build/h11/cisa --prompts /tmp/h11/prompts \\
        --model gemma3-270m=models/gemma-3-270m-q4_k_m.gguf \\
        --model smollm2-135m=models/SmolLM2-135M-Instruct.Q4_1.gguf -n 24 --out RESULT.json

llama.cpp: a fresh Llama(model, n_ctx, n_threads=2, n_threads_batch=2, verbose=False) per prompt
(so no KV prefix is reused between prompts); everything else is llama-cpp-python 0.3.36's default
(n_batch = n_ubatch = 512, f16 KV cache, flash attention off, full-size SWA cache), and
create_completion(prompt, max_tokens=n, temperature=0) (its sampler chain is then greedy; the
default repeat_penalty is 1.0). cisa: `cisa run -m FILE -f PROMPT -n N --greedy --threads 2 --json
--quiet` [--llamacpp-numerics]. A pair is "identical" when the two texts are equal (the same
tokens, decoded), and shares 40 characters when the first 40 characters are equal (both texts at
least that long).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cisa", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--model", action="append", required=True, help="NAME=GGUF")
    ap.add_argument("-n", type=int, default=24)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import llama_cpp  # type: ignore

    idx = json.loads((pathlib.Path(args.prompts) / "index.json").read_text())
    doc = {"llama_cpp_python": llama_cpp.__version__, "n": args.n, "n_ctx": args.n_ctx,
           "prompts_source": idx["source"], "models": {}}
    for spec in args.model:
        name, path = spec.split("=", 1)
        rows = []
        for p in idx["prompts"]:
            ptext = (pathlib.Path(args.prompts) / f"{p['name']}.txt").read_text(encoding="utf-8")
            t0 = time.time()
            llm = llama_cpp.Llama(model_path=path, n_ctx=args.n_ctx, n_threads=2, n_threads_batch=2,
                                  verbose=False)
            r = llm.create_completion(ptext, max_tokens=args.n, temperature=0)
            ll = {"text": r["choices"][0]["text"], "prompt_tokens": r["usage"]["prompt_tokens"],
                  "tokens": r["usage"]["completion_tokens"], "seconds": round(time.time() - t0, 2)}
            del llm
            row = {"name": p["name"], "words": p["words"], "llama.cpp": ll}
            for mode, extra in (("cisa_llamacpp_numerics", ["--llamacpp-numerics"]),
                                ("cisa_default", [])):
                t0 = time.time()
                out = subprocess.run([args.cisa, "run", "-m", path, "-f",
                                      str(pathlib.Path(args.prompts) / f"{p['name']}.txt"),
                                      "-n", str(args.n), "--greedy", "--threads", "2", "--json",
                                      "--quiet", *extra], capture_output=True, text=True, check=True)
                j = json.loads(out.stdout)
                row[mode] = {"text": j["text"], "prompt_tokens": j["prompt_tokens"],
                             "tokens": j["generated_tokens"], "seconds": round(time.time() - t0, 2)}
                row[mode]["identical"] = j["text"] == ll["text"]
                row[mode]["first40_same"] = (len(j["text"]) >= 40 and len(ll["text"]) >= 40
                                             and j["text"][:40] == ll["text"][:40])
            rows.append(row)
            print(f"[{time.strftime('%H:%M:%S')}] {name} {p['name']} ({p['words']} words, "
                  f"{ll['prompt_tokens']} tokens): llama.cpp-numerics identical "
                  f"{row['cisa_llamacpp_numerics']['identical']}, default identical "
                  f"{row['cisa_default']['identical']}", flush=True)
        summary = {mode: {"identical": sum(r[mode]["identical"] for r in rows),
                          "first40_same": sum(r[mode]["first40_same"] for r in rows),
                          "prompts": len(rows)}
                   for mode in ("cisa_llamacpp_numerics", "cisa_default")}
        doc["models"][name] = {"file": path, "summary": summary, "prompts": rows}
        print(f"{name}: {json.dumps(summary)}", flush=True)
    pathlib.Path(args.out).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
