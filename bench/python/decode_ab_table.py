#!/usr/bin/env python3
"""Summarise the decode A/B of one gpu_decode_session.sh call.

Reads the archive the script returns (all.tgz: layer/layer_<run>.json from `cisa bench layer
--json`, layer/anchors.json from anchors_layer.py) and prints, for every run and geometry, the
int8/native decode row (top-k, scoring, busy and graph-step ms) and the reuse rows of the r in
--reuse (default 2, 4, 8: kept and fresh graph steps, per-step busy and graph step), each with its
ratio to the best dense anchor of the same call (busy / step).

The last column is the graph step's ratio as a share of the byte ratio: the dense step's bytes
(the cache it reads) over the bytes a CISA step must read, the selected pages' K/V every step and
the representatives once per fresh selection (kv_bytes + rep_bytes / r of the run's own row). At
that share of the dense kernel's read rate a step would reach the ratio printed; 100 % means
reading exactly those bytes as fast as the best dense kernel reads the cache.

Runs at other budgets (`cisa bench layer --budget k`, e.g. gpu_decode_session.sh's
AB_SETS="--budget 2048;--budget 8192") add a least-squares line per geometry through the
decode attention times of every run with scattered pages against the K/V bytes they read:
its intercept is what an attention launch costs whatever it reads, its slope the rate at which
it reads the pages, beside the best dense kernel's rate over the whole cache in the same call.

  python3 bench/python/decode_ab_table.py bench/results/<folder>/<call>/all.tgz
"""
import argparse
import collections
import json
import tarfile


def byte_ratio(dense_bytes, cisa_row, r):
    """Dense bytes over a CISA step's: the selected K/V each step, the representatives 1/r."""
    return dense_bytes / (cisa_row["kv_bytes"] + cisa_row["rep_bytes"] / r)


def best_dense(members):
    """members: (name, parsed JSON) of the archive's layer/*.json. The fastest decode anchor of
    cuDNN and FlashAttention by geometry (its row of layer/anchors.json: ms, and tb_s)."""
    best = {}
    for name, d in members:
        if name != "layer/anchors.json":
            continue
        for r in d["anchors"]:
            if r.get("phase") == "decode" and r.get("method") in ("cudnn", "flash"):
                if r["geometry"] not in best or r["ms"] < best[r["geometry"]]["ms"]:
                    best[r["geometry"]] = r
    return best


def read_runs(members, reuse):
    """Per run of members (as best_dense's), {(geometry, tag): (what, busy ms, step ms, byte
    ratio)}."""
    rows = collections.defaultdict(dict)
    for name, d in members:
        if name == "layer/anchors.json":
            continue
        run = name[len("layer/"):-len(".json")]
        res = [r for r in d.get("results", []) if r.get("phase") == "decode"]
        dense = {r["geometry"]: r["kv_bytes"] for r in res if r.get("method") == "dense"}
        cisa = {r["geometry"]: r for r in res if r.get("method") == "cisa"}

        def ratio_of(geo, r):
            c = cisa.get(geo)
            if geo not in dense or c is None or "rep_bytes" not in c:
                return None
            return byte_ratio(dense[geo], c, r)

        for r in res:
            geo = r["geometry"]
            if r.get("method") == "cisa":
                rows[run][(geo, "")] = (f"top-k {r['topk_ms']:.3f} score {r['scoring_ms']:.3f}",
                                        r["busy_ms"], r["step_ms"], ratio_of(geo, 1))
            elif r.get("method") == "cisa-reuse" and r.get("reuse_steps") in reuse:
                n = r["reuse_steps"]
                rows[run][(geo, f"r={n}")] = (
                    f"kept {r['kept_step_ms']:.3f} fresh {r['fresh_step_ms']:.3f}",
                    r["busy_ms"], r["step_ms"], ratio_of(geo, n))
    return rows


def line_fit(points):
    """Least-squares line through [(x, y)]: (intercept, slope), or None where every x is the
    same."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def attention_fit(members):
    """Per geometry, a least-squares line ms = fixed + bytes / rate through the decode attention
    times of the runs with scattered pages (block tables a random permutation of the pool), if
    they read at least two different byte counts. Returns {geometry: (points, fixed ms, rate
    TB/s, budgets)}."""
    pts = collections.defaultdict(list)
    for name, d in members:
        if name == "layer/anchors.json" or "pool order" in d.get("block_tables", ""):
            continue
        for r in d.get("results", []):
            if (r.get("phase") == "decode" and r.get("method") == "cisa"
                    and "attention_ms" in r and "kv_bytes" in r):
                pts[r["geometry"]].append((r["kv_bytes"], r["attention_ms"], d.get("budget")))
    fits = {}
    for geo, p in pts.items():
        line = line_fit([(x, y) for x, y, _ in p])
        if line is None:
            continue
        fixed, slope = line  # ms, ms per byte
        fits[geo] = (len(p), fixed, 1e-9 / slope, sorted({b for _, _, b in p if b}))
    return fits


def table(best, rows):
    out = ["best dense ms: " + str({g: round(v, 3) for g, v in best.items()})]
    for run in sorted(rows):
        for (geo, tag), (what, busy, step, bytes_x) in sorted(rows[run].items()):
            a = best.get(geo)
            ratio = f"{a / busy:.2f}x / {a / step:.2f}x" if a else ""
            share = f"  of bytes {bytes_x:.2f}x: {a / step / bytes_x:.0%}" if a and bytes_x else ""
            out.append(f"{run:22s} {geo:5s} {tag:4s} {what:28s} busy {busy:.3f} step {step:.3f}"
                       f"  {ratio}{share}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archive", help="all.tgz of a gpu_decode_session.sh call")
    ap.add_argument("--reuse", default="2,4,8", help="comma-separated r of the reuse rows")
    args = ap.parse_args()
    reuse = {int(r) for r in args.reuse.split(",") if r}
    with tarfile.open(args.archive) as t:
        members = [(m.name, json.load(t.extractfile(m))) for m in t.getmembers()
                   if m.name.startswith("layer/") and m.name.endswith(".json")]
    best = best_dense(members)
    print("\n".join(table({g: r["ms"] for g, r in best.items()}, read_runs(members, reuse))))
    for geo, (n, fixed, rate, budgets) in sorted(attention_fit(members).items()):
        tb_s = best.get(geo, {}).get("tb_s")
        d = f", best dense kernel {tb_s:.2f} TB/s" if tb_s else ""
        print(f"attention fit {geo:5s} ({n} runs, budgets {budgets}): fixed {fixed * 1e3:.1f} us, "
              f"pages read at {rate:.2f} TB/s{d}")


if __name__ == "__main__":
    main()
