#!/usr/bin/env python3
"""Per-layer budget weights for `cisa eval --layer-budgets` from `cisa diagnose --json` output.

The diagnostics give, per global layer, the dense attention mass on the pages CISA attends at a
uniform budget k (`cisa_mass`) and with the oracle's top-k (`oracle_mass`). The mass a layer
misses at uniform k is m_l = oracle_mass - cisa_mass. The weight of layer l is

    w_l = m_l + floor * mean(m)

so with --floor 0 the budget follows the missed mass alone, and with --floor 1 half the total is
spread evenly (every layer keeps at least about half of k) and half follows the missed mass. The
model splits k x (CISA layers) chunks in proportion to the weights (split_layer_budgets in
include/cisa/model/model.h), so the total stays that of the uniform budget. Several diagnose
files (e.g. two calibration documents) are averaged per layer.

    cisa diagnose -m models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --indexer indexers/smollm2-135m.cisaidx -f calib-texts/calib-pride-prejudice.txt \\
        --tokens 8064 --budget 47 --window 128 --sink-pages 1 --positions 24 --json > diag.json
    python3 scripts/layer_budgets.py diag.json --floor 1 -o indexers/smollm2-135m.budgets-f1.txt

With --curves the inputs are one text's diagnostics at several budgets (k1 < k2 < ...). Each
layer's captured mass cisa_mass(k) is then a curve, linear between the measured budgets, and the
total REF_K x (layers) chunks goes, one chunk at a time, to the layer whose curve rises most at
its current budget (every layer starts at the smallest measured k; past the largest a layer gains
nothing). The weights written are those budgets, so the model's proportional split reproduces
them at REF_K:

    python3 scripts/layer_budgets.py --curves --ref-k 47 diag12.json diag24.json diag47.json \
        diag94.json diag188.json -o indexers/smollm2-135m.budgets-curves.txt
"""
import argparse
import json
import sys


def load(paths):
    """The diagnose runs, and one line describing each for the output's header."""
    runs, meta = [], []
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        runs.append(d)
        meta.append("%s: k %d, W %d, sinks %d, %d tokens, %d positions" % (
            path, d["budget"], d["window"], d["sink_pages"], d["tokens"], d["positions"]))
    return runs, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("diagnose_json", nargs="+", help="cisa diagnose --json output(s)")
    ap.add_argument("--floor", type=float, default=1.0,
                    help="weight added to every layer, in units of the mean missed mass")
    ap.add_argument("-o", "--output", required=True, help="sidecar to write (LAYER WEIGHT lines)")
    ap.add_argument("--curves", action="store_true",
                    help="inputs are one text at several budgets: split by marginal captured mass")
    ap.add_argument("--ref-k", type=int, default=0,
                    help="with --curves: the uniform budget whose total is split")
    a = ap.parse_args()
    if a.floor < 0:
        sys.exit("--floor must be >= 0")
    if a.curves:
        return curves(a)

    missed = {}
    n_layer = 0
    runs, meta = load(a.diagnose_json)
    for d in runs:
        for l in d["layers"]:
            missed.setdefault(l["layer"], []).append(max(0.0, l["oracle_mass"] - l["cisa_mass"]))
            n_layer = max(n_layer, l["layer"] + 1)
    m = {l: sum(v) / len(v) for l, v in missed.items()}
    mean = sum(m.values()) / len(m)
    with open(a.output, "w") as out:
        out.write("# per-layer budget weights for cisa eval --layer-budgets "
                  "(scripts/layer_budgets.py)\n")
        out.write("# weight = missed mass (oracle - cisa at uniform k) + %g x mean missed mass "
                  "(%.5f)\n" % (a.floor, mean))
        for line in meta:
            out.write("# from " + line + "\n")
        out.write("# layer weight   (missed mass)\n")
        for l in range(n_layer):
            # Layers the diagnostics do not list (sliding-window ones) never run CISA: weight 0.
            w = m[l] + a.floor * mean if l in m else 0.0
            out.write("%d %.6f   # %.5f\n" % (l, w, m.get(l, 0.0)))
    print("wrote %s (%d layers)" % (a.output, n_layer))


def curves(a):
    if a.ref_k < 1:
        sys.exit("--curves needs --ref-k >= 1")
    points = {}  # layer -> [(k, captured mass)]
    runs, meta = load(a.diagnose_json)
    for d in runs:
        for l in d["layers"]:
            points.setdefault(l["layer"], []).append((d["budget"], l["cisa_mass"]))
    ks = sorted({k for v in points.values() for k, _ in v})
    if len(ks) < 2:
        sys.exit("--curves needs diagnostics at two budgets or more")
    for l, v in points.items():
        if sorted(k for k, _ in v) != ks:
            sys.exit("layer %d is not measured at every budget %s" % (l, ks))
        v.sort()
    layers = sorted(points)

    def slope(l, k):  # captured mass per chunk of the segment holding k (0 past the last)
        v = points[l]
        for (k0, m0), (k1, m1) in zip(v, v[1:]):
            if k0 <= k < k1:
                return (m1 - m0) / (k1 - k0)
        return 0.0

    alloc = {l: ks[0] for l in layers}
    left = a.ref_k * len(layers) - ks[0] * len(layers)
    if left < 0:
        sys.exit("--ref-k %d is below the smallest measured budget %d" % (a.ref_k, ks[0]))
    for _ in range(left):
        best = max(layers, key=lambda l: (slope(l, alloc[l]), -l))
        alloc[best] += 1
    n_layer = max(layers) + 1
    with open(a.output, "w") as out:
        out.write("# per-layer budget weights for cisa eval --layer-budgets "
                  "(scripts/layer_budgets.py --curves)\n")
        out.write("# weight = the layer's budget when %d x %d chunks go one at a time to the "
                  "largest rise of captured mass (budgets %s)\n" % (a.ref_k, len(layers), ks))
        for line in meta:
            out.write("# from " + line + "\n")
        out.write("# layer weight   (captured mass at the smallest and largest budget)\n")
        for l in range(n_layer):
            if l not in alloc:
                out.write("%d 0.000000\n" % l)
                continue
            out.write("%d %.6f   # %.4f .. %.4f\n" % (l, alloc[l], points[l][0][1], points[l][-1][1]))
    print("wrote %s (%d layers): budgets %s" % (a.output, n_layer,
                                               " ".join(str(alloc[l]) for l in layers)))


if __name__ == "__main__":
    main()
