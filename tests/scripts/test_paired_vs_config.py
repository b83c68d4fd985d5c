#!/usr/bin/env python3
"""bench/eval/paired_vs_config.py's document KL ratios and plot_kl_ratio.py (ctest
scripts_paired_vs_config_test), on a synthetic results.jsonl whose answers are known.

Four documents at 4096 tokens: the base's per-token KL is 1, 2, 3, 4 (with 3, 5, 2, 4 positions),
a config's is exactly twice it, another's exactly the base's on three documents and 10x on one.
The ratio of mean KL per token is computed here from the definition; a constant ratio has a
degenerate bootstrap interval equal to it. The plot script must write a PNG when matplotlib is
there, and fail with a message on a run without the base.
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
from paired_vs_config import doc_kl_rows  # noqa: E402

BASE, TWICE, ONE_BAD = "cisa:x8", "cisa:x8:fp8", "cisa:x8:int8"
POS = [3, 5, 2, 4]


def records():
    out = []
    for i, n in enumerate(POS):
        doc = "doc/4096/%d/book" % i
        kl = float(i + 1)
        out.append({"id": doc, "task": "doc", "length": 4096, "config": "dense", "kl": [0.0] * n})
        out.append({"id": doc, "task": "doc", "length": 4096, "config": BASE, "kl": [kl] * n})
        out.append({"id": doc, "task": "doc", "length": 4096, "config": TWICE, "kl": [2 * kl] * n})
        bad = 10 * kl if i == 2 else kl
        out.append({"id": doc, "task": "doc", "length": 4096, "config": ONE_BAD, "kl": [bad] * n})
    return out


def main():
    rows = {r[0]: r for r in doc_kl_rows(records(), BASE, "", random.Random(1))}
    assert set(rows) == {TWICE, ONE_BAD}, rows
    cfg, length, n, ratio, lo, hi, larger = rows[TWICE]
    assert (length, n, larger) == (4096, 4, 4), rows[TWICE]
    assert abs(ratio - 2) < 1e-12 and abs(lo - 2) < 1e-12 and abs(hi - 2) < 1e-12, rows[TWICE]
    # By the definition: (Σ KL sums / Σ positions) over the base's.
    base = sum((i + 1) * p for i, p in enumerate(POS)) / sum(POS)
    bad = sum((10 if i == 2 else 1) * (i + 1) * p for i, p in enumerate(POS)) / sum(POS)
    _, _, _, ratio, lo, hi, larger = rows[ONE_BAD]
    assert abs(ratio - bad / base) < 1e-12, (ratio, bad / base)
    assert larger == 1 and lo <= ratio <= hi and lo >= 1.0, rows[ONE_BAD]

    script = os.path.join(EVAL, "plot_kl_ratio.py")
    with tempfile.TemporaryDirectory() as d:
        run = os.path.join(d, "run")
        os.mkdir(run)
        with open(os.path.join(run, "results.jsonl"), "w") as f:
            for r in records():
                f.write(json.dumps(r) + "\n")
        missing = subprocess.run([sys.executable, script, run, "--base", "nope", "--out",
                                  os.path.join(d, "x.png")], capture_output=True, text=True)
        assert missing.returncode != 0 and "no documents" in missing.stderr, missing
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("matplotlib missing: the plot itself is not drawn")
            return
        png = os.path.join(d, "kl.png")
        ok = subprocess.run([sys.executable, script, run, "--base", BASE, "--out", png],
                            capture_output=True, text=True)
        assert ok.returncode == 0, ok.stderr
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    print("ok")


if __name__ == "__main__":
    main()
