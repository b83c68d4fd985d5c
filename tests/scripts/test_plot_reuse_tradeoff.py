#!/usr/bin/env python3
"""bench/eval/plot_reuse_tradeoff.py (ctest scripts_plot_reuse_tradeoff_test) on synthetic
inputs whose answers are known.

Speed: a layer JSON whose cisa-reuse rows' busy times are the formula's own (fixed + fresh/r +
kept (r - 1)/r, written out here with other numbers than the script's code path), and anchors
with two dense kernels per geometry: the line must start at the per-step speedup over the faster
one, pass through every measured r, and a geometry without an anchor is left out.
Quality: two documents whose decode lists kept 3 of 4 and 1 of 4 (share 4 / 8), KL exactly twice
the base's; a second run repeating a configuration is ignored for it. Then the PNG, and the
errors for a run without the base and a --runs entry without a label.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
EVAL = os.path.join(HERE, "..", "..", "bench", "eval")
sys.path.insert(0, EVAL)
from plot_reuse_tradeoff import quality_points, speed_lines  # noqa: E402

SETUP, ATT, OTHER, FRESH, KEPT = 0.01, 0.15, 0.002, 0.1, 0.02


def layer():
    rows = [{"geometry": g, "phase": "decode", "method": "cisa", "setup_ms": SETUP,
             "attention_ms": ATT, "other_ms": OTHER, "busy_ms": SETUP + ATT + OTHER + FRESH}
            for g in ("4:1", "9:9")]
    for r in (2, 4, 8):
        busy = SETUP + ATT + OTHER + (FRESH + (r - 1) * KEPT) / r
        rows.append({"geometry": "4:1", "phase": "decode", "method": "cisa-reuse",
                     "reuse_steps": r, "fresh_select_ms": FRESH, "kept_select_ms": KEPT,
                     "busy_ms": busy})
    rows.append({"geometry": "4:1", "phase": "prefill", "method": "cisa", "setup_ms": 1.0,
                 "attention_ms": 1.0, "busy_ms": 2.0})
    return {"rep_precision": "int8", "context": 1048576, "results": rows}


ANCHORS = {"anchors": [{"geometry": "4:1", "phase": "decode", "method": "cudnn", "ms": 2.0},
                       {"geometry": "4:1", "phase": "decode", "method": "flash", "ms": 2.5},
                       {"geometry": "4:1", "phase": "prefill", "method": "cudnn", "ms": 0.1}]}


def records(base, cfg):
    out = []
    for i, kept in enumerate((3, 1)):
        doc = "doc/4096/%d/book" % i
        for c, kl, stats in (("dense", 0.0, {}), (base, 1.0 + i, {}),
                             (cfg, 2.0 * (1.0 + i),
                              {"reuse_lists_kept": kept, "reuse_lists_selected": 4 - kept})):
            out.append({"id": doc, "task": "doc", "length": 4096, "config": c, "kl": [kl] * 5,
                        "stats": stats})
    return out


def write_run(d, name, rows):
    run = os.path.join(d, name)
    os.mkdir(run)
    with open(os.path.join(run, "results.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return run


def main():
    lines = speed_lines(layer(), ANCHORS)
    assert set(lines) == {"4:1"}, lines  # 9:9 has no anchor
    dense, fixed, fresh, kept, marks = lines["4:1"]
    assert dense == 2.0 and abs(fixed - (SETUP + ATT + OTHER)) < 1e-15, lines
    assert (fresh, kept) == (FRESH, KEPT) and [m[0] for m in sorted(marks)] == [2, 4, 8], lines
    for r, busy in marks:
        f = (r - 1) / r
        assert abs(fixed + (1 - f) * fresh + f * kept - busy) < 1e-12, (r, busy)

    base, cfg = "cisa:x8", "cisa:x8:r4:m100"
    with tempfile.TemporaryDirectory() as d:
        run = write_run(d, "run", records(base, cfg))
        pts = quality_points("M", run, base, random.Random(1))
        assert len(pts) == 1, pts
        label, c, length, n, share, ratio, lo, hi = pts[0]
        assert (label, c, length, n) == ("M", cfg, 4096, 2), pts
        assert share == 0.5 and abs(ratio - 2) < 1e-12 and abs(lo - 2) < 1e-12, pts

        script = os.path.join(EVAL, "plot_reuse_tradeoff.py")
        lj, aj = os.path.join(d, "layer.json"), os.path.join(d, "anchors.json")
        json.dump(layer(), open(lj, "w"))
        json.dump(ANCHORS, open(aj, "w"))
        common = [sys.executable, script, "--layer", lj, "--anchors", aj, "--base", base]
        bad = subprocess.run(common + ["--runs", run, "--out", os.path.join(d, "x.png")],
                             capture_output=True, text=True)
        assert bad.returncode != 0 and "LABEL=RUN_DIR" in bad.stderr, bad
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("matplotlib missing: the plot itself is not drawn")
            return
        none = subprocess.run(common[:-1] + ["nope", "--runs", "M=" + run, "--out",
                                             os.path.join(d, "x.png")],
                              capture_output=True, text=True)
        assert none.returncode != 0 and "no documents" in none.stderr, none
        png = os.path.join(d, "reuse.png")
        ok = subprocess.run(common + ["--runs", "M=" + run, "M=" + run, "--out", png],
                            capture_output=True, text=True)
        assert ok.returncode == 0, ok.stderr
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    print("ok")


if __name__ == "__main__":
    main()
