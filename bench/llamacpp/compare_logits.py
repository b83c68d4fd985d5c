#!/usr/bin/env python3
"""Compares two CISALGT1 record files (cisa_logits, llamacpp_logits.py) row by row.

    python3 bench/llamacpp/compare_logits.py A.bin B.bin [--json]

Rows are matched by position (the index of the row's last input token). For each file pair it
prints the rows compared, how many are bit-identical over the whole vocabulary (equal checksums),
the first position whose row differs (and its phase: prefill / feed / generate), the largest
|difference| among A's top-20 logits there, and how many rows have the same argmax.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from llamacpp_logits import read  # noqa: E402

PHASES = ["prefill", "feed", "generate"]


def compare(a_path: str, b_path: str) -> dict:
    a, b = read(a_path), read(b_path)
    bi = {int(p): i for i, p in enumerate(b["position"])}
    rows = [(i, bi[int(p)]) for i, p in enumerate(a["position"]) if int(p) in bi]
    same = [bool(a["checksum"][i] == b["checksum"][j]) for i, j in rows]
    top1 = sum(int(a["argmax"][i] == b["argmax"][j]) for i, j in rows)
    out = {"a": a_path, "b": b_path, "rows": len(rows), "bit_identical": sum(same), "same_argmax": top1}
    first = next((k for k, s in enumerate(same) if not s), None)
    if first is not None:
        i, j = rows[first]
        # A's top-20 ids looked up in B's top 20 where present.
        b_top = dict(zip(b["top_ids"][j].tolist(), b["top_logits"][j].tolist()))
        diffs = [abs(float(v) - b_top[int(t)]) for t, v in zip(a["top_ids"][i], a["top_logits"][i])
                 if int(t) in b_top]
        out["first_difference"] = {
            "position": int(a["position"][i]), "phase": PHASES[int(a["phase"][i])],
            "max_abs_top20_diff": max(diffs) if diffs else None,
            "top1": [int(a["argmax"][i]), int(b["argmax"][j])]}
        diff_pos = [int(a["position"][i]) for (i, _), s in zip(rows, same) if not s]
        out["differing_positions"] = diff_pos[:20] + (["..."] if len(diff_pos) > 20 else [])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = compare(args.a, args.b)
    if args.json:
        print(json.dumps(r))
    else:
        fd = r.get("first_difference")
        print(f"{r['rows']} rows, {r['bit_identical']} bit-identical, {r['same_argmax']} same argmax; "
              + (f"first difference at position {fd['position']} ({fd['phase']}), max |top-20 diff| "
                 f"{fd['max_abs_top20_diff']:.3g}, top-1 {fd['top1']}" if fd else "no difference"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
