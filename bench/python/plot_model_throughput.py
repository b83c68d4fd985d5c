#!/usr/bin/env python3
"""Decode throughput against context from `scripts/gpu_model_session.sh` output (docs/bench-model.md).

Reads every `cisa bench model --json` document (model_*.json: dense and CISA runs) and every
transformers-anchor line (hf_*.jsonl) in the given files or folders, and draws decode tokens/s
against context, one line per (engine, batch), log-scaled context; the roofline of each cisa run
(B / floor) dashed.

    python3 bench/python/plot_model_throughput.py gpu-out/ -o throughput.png
"""
import argparse
import glob
import json
import os
import sys


def load(paths):
    pts = []  # (label, batch, context, tok_s, roofline_tok_s or None)
    files = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "*.json*"))) if os.path.isdir(p) else [p]
    for f in files:
        with open(f) as fh:
            text = fh.read()
        if f.endswith(".jsonl"):
            for line in text.splitlines():
                r = json.loads(line)
                if r.get("header") or r.get("error") or not r.get("decode_tok_s"):
                    continue
                pts.append(("transformers SDPA", r["batch"], r["context"], r["decode_tok_s"], None))
            continue
        try:
            j = json.loads(text)
        except json.JSONDecodeError:
            print(f"skipping {f}: not JSON", file=sys.stderr)
            continue
        if j.get("benchmark") != "model-fixed-output":
            continue
        for mode, r in j["runs"].items():
            floor = r["roofline"]["floor_ms"]
            roof = j["batch"] / (floor * 1e-3) if floor else None
            pts.append((f"cisa {mode}", j["batch"], j["context"], r["decode_tok_s"], roof))
    return pts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+", help="JSON files or folders")
    ap.add_argument("-o", "--output", default="model_throughput.png")
    a = ap.parse_args()
    pts = load(a.inputs)
    if not pts:
        print("no results found", file=sys.stderr)
        return 1
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for key in sorted({(p[0], p[1]) for p in pts}):
        sel = sorted((p for p in pts if (p[0], p[1]) == key), key=lambda p: p[2])
        line, = ax.plot([p[2] for p in sel], [p[3] for p in sel], marker="o", label=f"{key[0]}, B={key[1]}")
        if key[0] == "cisa dense" and all(p[4] for p in sel):
            ax.plot([p[2] for p in sel], [p[4] for p in sel], ls="--", color=line.get_color(),
                    alpha=0.6, label=f"dense roofline, B={key[1]}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens per request)")
    ax.set_ylabel("decode tokens/s (all requests)")
    ax.set_title("Whole-model decode throughput (synthetic weights, speed only)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.output, dpi=120)
    print(a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
