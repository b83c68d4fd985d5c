#!/usr/bin/env python3
"""Summarises the per-prompt runs of cisa_logits and llamacpp_logits.py (README.md, "Numerics").

For every MODEL and prompt NN it reads, from --dir:
  c_MODEL_NN_llamacpp.{bin,gen}  cisa_logits --numerics llamacpp --generate 24 (prefill 512)
  c_MODEL_NN_default.{bin,gen}   cisa_logits --numerics default  --generate 24
  l_MODEL_NN_last.{bin,gen}      llamacpp_logits.py --outputs last --generate 24: what
                                 llama-cpp-python's Llama does (n_batch 512, last-row logits)
  l_MODEL_NN_all.bin             llamacpp_logits.py --outputs all --generate 24 (optional)
and prints one JSON document: per prompt, whether the 24 greedy tokens are identical, whether the
decoded texts share their first 40 characters, and where the logits first differ.

    python3 bench/llamacpp/compare_runs.py --dir /tmp/h11/lg --model gemma=models/gemma-3-270m-q4_k_m.gguf
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from compare_logits import compare  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--model", action="append", required=True, help="TAG=GGUF")
    ap.add_argument("--prompts", type=int, default=20)
    args = ap.parse_args()
    import llama_cpp  # type: ignore
    d = pathlib.Path(args.dir)
    doc = {}
    for spec in args.model:
        tag, path = spec.split("=", 1)
        tok = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        text = lambda ids: tok.detokenize(ids).decode("utf-8", "replace")  # noqa: E731
        rows = []
        for i in range(args.prompts):
            nn = f"{i:02d}"
            need = [d / f"l_{tag}_{nn}_last.gen", d / f"c_{tag}_{nn}_llamacpp.gen", d / f"c_{tag}_{nn}_default.gen"]
            if not all(p.exists() for p in need):
                continue
            ll, cl, cd = ([int(x) for x in p.read_text().split()] for p in need)
            row = {"prompt": nn, "llama_text": text(ll)}
            for mode, ids in (("llamacpp_numerics", cl), ("default", cd)):
                t = text(ids)
                first = next((k for k, (a, b) in enumerate(zip(ids, ll)) if a != b), None)
                row[mode] = {"identical": ids == ll, "first40_same": t[:40] == row["llama_text"][:40]
                             and len(t) >= 40, "first_different_token": first}
            row["cisa_llamacpp_vs_llama_last"] = compare(str(d / f"c_{tag}_{nn}_llamacpp.bin"),
                                                          str(d / f"l_{tag}_{nn}_last.bin"))
            if (d / f"l_{tag}_{nn}_all.bin").exists():
                row["cisa_llamacpp_vs_llama_all"] = compare(str(d / f"c_{tag}_{nn}_llamacpp.bin"),
                                                             str(d / f"l_{tag}_{nn}_all.bin"))
                row["llama_all_vs_last"] = compare(str(d / f"l_{tag}_{nn}_all.bin"),
                                                   str(d / f"l_{tag}_{nn}_last.bin"))
            rows.append(row)
        doc[tag] = {"prompts": rows, "summary": {
            m: {"identical": sum(r[m]["identical"] for r in rows),
                "first40_same": sum(r[m]["first40_same"] for r in rows), "of": len(rows)}
            for m in ("llamacpp_numerics", "default")}}
    print(json.dumps(doc, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
