#!/usr/bin/env python3
"""One line per `cisa bench model --json` document: each run's median decode step and the
CISA / dense decode ratio (the device session scripts print it into their logs).

  python3 bench/python/bench_model_line.py bench_b2_l1m_r1.json [more.json ...]
"""
import json
import os
import sys

for path in sys.argv[1:]:
    try:
        j = json.load(open(path))
        runs = " ".join(f"{m} {r['decode_step_ms_median']:.2f} ms" for m, r in j["runs"].items())
        print(" ", os.path.basename(path), runs,
              "ratio %.3fx" % j["cisa_vs_dense"]["decode_speedup"])
    except (OSError, ValueError, KeyError) as e:
        print(" ", os.path.basename(path), "unreadable:", e)
