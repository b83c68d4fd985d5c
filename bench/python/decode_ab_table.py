#!/usr/bin/env python3
"""Summarise the decode A/B of one gpu_decode_session.sh call.

Reads the archive the script returns (all.tgz: layer/layer_<run>.json from `cisa bench layer
--json`, layer/anchors.json from anchors_layer.py) and prints, for every run and geometry, the
int8/native decode row (top-k, scoring, busy and graph-step ms) and the reuse rows of the r in
--reuse (default 2, 4, 8: kept and fresh graph steps, per-step busy and graph step), each with its
ratio to the best dense anchor of the same call (busy / step).

  python3 bench/python/decode_ab_table.py bench/results/<folder>/<call>/all.tgz
"""
import argparse
import collections
import json
import tarfile


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archive", help="all.tgz of a gpu_decode_session.sh call")
    ap.add_argument("--reuse", default="2,4,8", help="comma-separated r of the reuse rows")
    args = ap.parse_args()
    reuse = {int(r) for r in args.reuse.split(",") if r}
    rows = collections.defaultdict(dict)
    best = {}
    with tarfile.open(args.archive) as t:
        for m in t.getmembers():
            if not (m.name.startswith("layer/") and m.name.endswith(".json")):
                continue
            d = json.load(t.extractfile(m))
            if m.name == "layer/anchors.json":
                for r in d["anchors"]:
                    if r.get("phase") == "decode" and r.get("method") in ("cudnn", "flash"):
                        g = r["geometry"]
                        best[g] = min(best.get(g, float("inf")), r["ms"])
                continue
            run = m.name[len("layer/"):-len(".json")]
            for r in d.get("results", []):
                if r.get("phase") != "decode":
                    continue
                if r.get("method") == "cisa":
                    rows[run][(r["geometry"], "")] = (
                        f"top-k {r['topk_ms']:.3f} score {r['scoring_ms']:.3f}",
                        r["busy_ms"], r["step_ms"])
                elif r.get("method") == "cisa-reuse" and r.get("reuse_steps") in reuse:
                    rows[run][(r["geometry"], f"r={r['reuse_steps']}")] = (
                        f"kept {r['kept_step_ms']:.3f} fresh {r['fresh_step_ms']:.3f}",
                        r["busy_ms"], r["step_ms"])
    print("best dense ms:", {g: round(v, 3) for g, v in best.items()})
    for run in sorted(rows):
        for (geo, tag), (what, busy, step) in sorted(rows[run].items()):
            a = best.get(geo)
            ratio = f"{a / busy:.2f}x / {a / step:.2f}x" if a else ""
            print(f"{run:22s} {geo:5s} {tag:4s} {what:28s} busy {busy:.3f} step {step:.3f}  {ratio}")


if __name__ == "__main__":
    main()
