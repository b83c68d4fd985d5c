#!/usr/bin/env python3
"""scripts/layer_budgets.py --curves against a brute-force split (ctest scripts_layer_budgets_test).

Three layers measured at budgets 2, 4 and 8 with concave captured-mass curves: the greedy split
of ref_k x 3 chunks must reach the largest total captured mass of any split (every layer between
the smallest and the largest measured budget), found by trying them all. Bad inputs exit non-zero.
"""
import itertools
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "layer_budgets.py")
KS = [2, 4, 8]
# captured mass of each layer at KS (concave: the rises shrink)
MASS = {0: [0.50, 0.70, 0.80], 1: [0.60, 0.64, 0.66], 2: [0.30, 0.60, 0.84]}


def interp(layer, k):
    v = list(zip(KS, MASS[layer]))
    for (k0, m0), (k1, m1) in zip(v, v[1:]):
        if k0 <= k <= k1:
            return m0 + (m1 - m0) * (k - k0) / (k1 - k0)
    return MASS[layer][-1]


def write(d, k):
    path = os.path.join(d, "diag%d.json" % k)
    layers = [{"layer": l, "cisa_mass": MASS[l][KS.index(k)], "oracle_mass": 1.0} for l in MASS]
    with open(path, "w") as f:
        json.dump({"budget": k, "window": 4, "sink_pages": 1, "tokens": 1000, "positions": 8,
                   "layers": layers}, f)
    return path


def run(args):
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True)


def main():
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        files = [write(d, k) for k in KS]
        for ref_k in (2, 3, 4, 5, 6, 8):
            out = os.path.join(d, "w.txt")
            r = run(["--curves", "--ref-k", str(ref_k)] + files + ["-o", out])
            if r.returncode != 0:
                print("FAIL ref_k %d: %s" % (ref_k, r.stderr))
                failures += 1
                continue
            got = {}
            for line in open(out):
                if line.startswith("#"):
                    continue
                f = line.split()
                got[int(f[0])] = float(f[1])
            total = ref_k * len(MASS)
            if sum(got.values()) != total:
                print("FAIL ref_k %d: budgets %s do not sum to %d" % (ref_k, got, total))
                failures += 1
            best = max(sum(interp(l, a[l]) for l in MASS)
                       for a in itertools.product(range(KS[0], KS[-1] + 1), repeat=len(MASS))
                       if sum(a) == total)
            have = sum(interp(l, got[l]) for l in MASS)
            if abs(have - best) > 1e-12:
                print("FAIL ref_k %d: captured %.6f, best split %.6f (%s)" % (ref_k, have, best, got))
                failures += 1
        for bad in (["--curves"] + files,                       # no --ref-k
                    ["--curves", "--ref-k", "1"] + files,      # below the smallest budget
                    ["--curves", "--ref-k", "4", files[0]]):   # one budget only
            if run(bad + ["-o", os.path.join(d, "x.txt")]).returncode == 0:
                print("FAIL: accepted %s" % bad)
                failures += 1
    print("layer_budgets --curves: %s" % ("ok" if failures == 0 else "%d failures" % failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
