#!/usr/bin/env python3
"""bench/python/decode_ab_table.py (ctest scripts_decode_ab_table_test) on a synthetic archive
whose answers are written out here by hand.

One run with a dense row of 1,600 bytes, a CISA row reading 100 bytes of K/V and 60 of
representatives, and reuse rows at r = 2 and 3; anchors with cuDNN at 2.0 ms and FlashAttention
at 1.6 ms. The byte ratios are 1600 / 160 = 10, 1600 / 130 and 1600 / 120; a step of 0.2 ms is
1.6 / 0.2 = 8x, 80 % of 10x. A second run without the dense row prints no byte share, an r not
asked for is left out, and the command line reads the same archive. The attention fit: runs
at three budgets on the line ms = 0.012 + bytes / 2.5e9 give 12 us and 2.5 TB/s, a run with
pool-order pages is left out, and one budget alone gives no line.
"""
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench", "python")
sys.path.insert(0, BENCH)
from decode_ab_table import attention_fit, best_dense, read_runs, table  # noqa: E402

ANCHORS = {"anchors": [
    {"geometry": "4:1", "phase": "decode", "method": "cudnn", "ms": 2.0, "tb_s": 2.4},
    {"geometry": "4:1", "phase": "decode", "method": "flash", "ms": 1.6, "tb_s": 3.0},
    {"geometry": "4:1", "phase": "decode", "method": "sdpa-math", "ms": 0.1},
    {"geometry": "4:1", "phase": "prefill", "method": "cudnn", "ms": 0.5}]}


def layer(with_dense):
    rows = [{"geometry": "4:1", "phase": "decode", "method": "cisa", "topk_ms": 0.02,
             "scoring_ms": 0.05, "busy_ms": 0.25, "step_ms": 0.2, "kv_bytes": 100,
             "rep_bytes": 60},
            {"geometry": "4:1", "phase": "prefill", "method": "cisa", "busy_ms": 9.0,
             "step_ms": 9.0, "kv_bytes": 1, "rep_bytes": 1}]
    if with_dense:
        rows.append({"geometry": "4:1", "phase": "decode", "method": "dense", "kv_bytes": 1600,
                     "busy_ms": 2.1, "step_ms": 2.1})
    for r, step in ((2, 0.16), (3, 0.15), (8, 0.1)):
        rows.append({"geometry": "4:1", "phase": "decode", "method": "cisa-reuse",
                     "reuse_steps": r, "kept_step_ms": 0.1, "fresh_step_ms": 0.2,
                     "busy_ms": step + 0.01, "step_ms": step})
    return {"results": rows}


def main():
    members = [("layer/anchors.json", ANCHORS), ("layer/layer_int8.json", layer(True)),
               ("layer/layer_base.json", layer(False))]
    best = {g: r["ms"] for g, r in best_dense(members).items()}
    assert best == {"4:1": 1.6}, best  # the faster of cuDNN and FlashAttention, decode only
    rows = read_runs(members, {2, 3})
    ours = rows["layer_int8"]
    assert set(ours) == {("4:1", ""), ("4:1", "r=2"), ("4:1", "r=3")}, ours
    for tag, expect in (("", 10.0), ("r=2", 1600 / 130), ("r=3", 1600 / 120)):
        assert abs(ours[("4:1", tag)][3] - expect) < 1e-12, (tag, ours)
    assert all(v[3] is None for v in rows["layer_base"].values()), rows["layer_base"]
    lines = table(best, rows)
    line = next(x for x in lines if x.startswith("layer_int8") and "r=" not in x)
    assert "6.40x / 8.00x" in line and "of bytes 10.00x: 80%" in line, line
    line = next(x for x in lines if x.startswith("layer_int8") and "r=2" in x)
    # 1.6 / 0.16 = 10x of 1600 / 130 = 12.31x: 81 %
    assert "10.00x" in line and "of bytes 12.31x: 81%" in line, line
    assert not any("of bytes" in x for x in lines if x.startswith("layer_base")), lines

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "all.tgz")
        with tarfile.open(path, "w:gz") as t:
            for name, obj in members + [("layer/session.log", None)]:
                data = b"log" if obj is None else json.dumps(obj).encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        out = subprocess.run([sys.executable, os.path.join(BENCH, "decode_ab_table.py"), path,
                              "--reuse", "2,3"], capture_output=True, text=True, check=True)
        assert out.stdout.splitlines() == lines, (out.stdout, lines)
    check_fit()
    print("ok")


def budget_run(budget, kv_bytes, attention_ms, tables="random permutation of the pool"):
    return {"budget": budget, "block_tables": tables, "results": [
        {"geometry": "4:1", "phase": "decode", "method": "cisa", "kv_bytes": kv_bytes,
         "attention_ms": attention_ms},
        {"geometry": "4:1", "phase": "prefill", "method": "cisa", "kv_bytes": 1,
         "attention_ms": 50.0}]}


def check_fit():
    # ms = 0.012 + bytes / 2.5e9 (2.5 TB/s); the pool-order run is off the line and left out.
    line = [(2048, 300e6), (4096, 550e6), (4096, 550e6), (8192, 1050e6)]
    members = [("layer/anchors.json", ANCHORS)]
    members += [("layer/run%d.json" % i, budget_run(k, b, 0.012 + b / 2.5e9))
                for i, (k, b) in enumerate(line)]
    members.append(("layer/pool.json", budget_run(4096, 550e6, 0.01, "pool order (x)")))
    fits = attention_fit(members)
    dense_rate = {g: r["tb_s"] for g, r in best_dense(members).items()}
    assert set(fits) == {"4:1"} and dense_rate == {"4:1": 3.0}, (fits, dense_rate)
    n, fixed, rate, budgets = fits["4:1"]
    assert n == 4 and budgets == [2048, 4096, 8192], fits
    assert abs(fixed - 0.012) < 1e-12 and abs(rate - 2.5) < 1e-9, fits
    # One byte count only (the same budget twice): no line.
    assert attention_fit(members[:1] + [members[2], members[3]]) == {}, "one budget"


if __name__ == "__main__":
    main()
