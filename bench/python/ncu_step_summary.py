#!/usr/bin/env python3
"""Kernel times of profiled decode steps, from ncu's CSV.

`cisa bench model --backend cuda --profile-step N` brackets decode step N of each run (dense
first, then CISA) with the profiler's start and stop; under

    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv cisa bench model ... \
        --cuda-graphs off --profile-step 2 > step.csv

ncu times every kernel of those steps alone. A step ends with the argmax kernel (greedy
sampling on the device), so the launches are cut into steps there. For each step this prints
the summed kernel time, the launch count and the kernels grouped by what they do, largest first.

    python3 bench/python/ncu_step_summary.py step.csv --labels dense,cisa [--json out.json]
"""
import argparse
import csv
import json
import re
import sys

# (group, pattern over the kernel's name), first match wins.
GROUPS = [
    ("gemm (ours)", r"skinny_gemm|skinny_stream"),
    ("gemm (cuBLASLt)", r"gemm|xmma|nvjet|cutlass|splitK|sm90_|gemv|Kernel2"),
    ("stacked-product split", r"split_columns"),
    ("attention", r"attention_kernel|attention_wgmma"),
    ("attention merge", r"merge_kernel"),
    ("scoring", r"score|index_query"),
    ("top-k", r"topk|select_kernel|radix"),
    ("page lists / unions", r"assemble_lists|union"),
    ("representatives", r"update_reps"),
    ("KV append", r"append_kv"),
    ("rms norm", r"rms_norm"),
    ("rope", r"rope"),
    ("mean of heads", r"mean_heads"),
    ("bf16 conversion", r"f32_to_bf16|bf16_to_f32"),
    ("residual add", r"add_kernel"),
    ("gated activation", r"gated_kernel|gated_stacked"),
    ("embedding", r"embed"),
    ("argmax", r"argmax"),
]


def group_of(name):
    for g, pat in GROUPS:
        if re.search(pat, name):
            return g
    return "other"


def read_launches(path):
    """(kernel name, microseconds) of every launch, in order."""
    out = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own ==PROF== lines are not CSV
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        us = {"nsecond": v / 1e3, "ns": v / 1e3, "usecond": v, "us": v, "msecond": v * 1e3, "ms": v * 1e3,
              "second": v * 1e6, "s": v * 1e6}[unit]
        out.append((row["Kernel Name"], us))
    return out


def split_steps(launches):
    steps, cur = [], []
    for name, us in launches:
        cur.append((name, us))
        if "argmax" in name:
            steps.append(cur)
            cur = []
    if cur:
        steps.append(cur)
    return steps


def summarise(step):
    groups = {}
    for name, us in step:
        g = groups.setdefault(group_of(name), {"us": 0.0, "launches": 0, "kernels": {}})
        g["us"] += us
        g["launches"] += 1
        k = g["kernels"].setdefault(name[:90], {"us": 0.0, "launches": 0})
        k["us"] += us
        k["launches"] += 1
    return {
        "total_us": sum(us for _, us in step),
        "launches": len(step),
        "groups": dict(sorted(groups.items(), key=lambda kv: -kv[1]["us"])),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--labels", default="dense,cisa", help="names of the steps, in order")
    ap.add_argument("--json", help="write the summary here too")
    args = ap.parse_args()
    steps = split_steps(read_launches(args.csv))
    if not steps:
        sys.exit("no gpu__time_duration rows in " + args.csv)
    labels = args.labels.split(",")
    result = {}
    for i, step in enumerate(steps):
        label = labels[i] if i < len(labels) else "step%d" % i
        s = summarise(step)
        result[label] = s
        print("%s: %.3f ms of kernels in %d launches" % (label, s["total_us"] / 1e3, s["launches"]))
        for g, v in s["groups"].items():
            print("  %-22s %8.1f us %5d launches  %5.1f %%" %
                  (g, v["us"], v["launches"], 100 * v["us"] / s["total_us"]))
            for k, kv in sorted(v["kernels"].items(), key=lambda kv: -kv[1]["us"])[:3]:
                print("      %8.1f us %5d  %s" % (kv["us"], kv["launches"], k))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
