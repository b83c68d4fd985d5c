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
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("diagnose_json", nargs="+", help="cisa diagnose --json output(s)")
    ap.add_argument("--floor", type=float, default=1.0,
                    help="weight added to every layer, in units of the mean missed mass")
    ap.add_argument("-o", "--output", required=True, help="sidecar to write (LAYER WEIGHT lines)")
    a = ap.parse_args()
    if a.floor < 0:
        sys.exit("--floor must be >= 0")

    missed = {}
    meta = []
    n_layer = 0
    for path in a.diagnose_json:
        with open(path) as f:
            d = json.load(f)
        meta.append("%s: k %d, W %d, sinks %d, %d tokens, %d positions" % (
            path, d["budget"], d["window"], d["sink_pages"], d["tokens"], d["positions"]))
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


if __name__ == "__main__":
    main()
