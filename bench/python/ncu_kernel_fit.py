#!/usr/bin/env python3
"""In-kernel times of the decode layer benchmark under ncu, and their line against the budget.

A device call profiles `cisa bench layer --phase decode --geometry G --budget K` (dense and CISA
launches alike, one process per file) with

    ncu --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum[,dram__bytes_read.sum][,sm__cycles_active.avg,\
                  sm__cycles_active.min,sm__cycles_elapsed.max] \
        -k regex:"attention_kernel|merge_kernel" --csv --page raw cisa bench layer ... \
        > ncu_<geo>_<budget>[_<tag>].csv     (geo written 4x1, 32x1, ...)

(bench/results/decode_fixed_cost_2026-12-07/call2_h100/call.sh). For every file this prints each
kernel's CISA launches: their count and median time (and, when measured, the DRAM bytes and how
busy the SMs were: the mean SM's active cycles over the launch's elapsed ones, and the least busy
SM's). The dense decode kernel is the same attention kernel reading the whole cache, ~10x longer:
launches of a kernel that take more than half its longest, where others take less, are the dense
ones (a merge launch goes with the attention launch before it); of other kernels the long and the
short launches are shown apart (a scoring launch of a kept selection returns early). For each
geometry and tag with two or more budgets it fits the CISA attention (plus merge) medians against
the budget: the intercept is the time a launch costs whatever it reads (us at budget 0, the
window's pages included), the slope the rate its chunks stream at (`--chunk-bytes`: K/V bytes per
chunk of the budget, all sequences and KV heads together).

    python3 bench/python/ncu_kernel_fit.py call2_h100/ncu.tgz [--chunk-bytes 4:1=131072,...]
"""
import argparse
import csv
import io
import re
import statistics
import sys
import tarfile

from decode_ab_table import line_fit

# K/V bytes per chunk of the budget in `cisa bench layer` (16 tokens x d = 128 x bf16 x K and V,
# times sequences x KV heads): 4:1 x 16, 32:1 x 32, 32:2 x 16 (2 KV heads).
CHUNK_BYTES = {"4:1": 16 * 8192, "32:1": 32 * 8192, "32:2": 32 * 8192}
NAME = re.compile(r"ncu_(\d+)x(\d+)_(\d+)(?:_(.+))?\.csv$")


def number(row, key):
    value = row.get(key)
    return float(value.replace(",", "")) if value else None


def read_csv(text):
    """The profiled launches of one ncu --csv --page raw output: [(kernel, us, extra)], extra
    holding what else was measured: "dram" (bytes read), "busy" and "first" (the SMs' mean and
    least active cycles over the launch's elapsed cycles, from sm__cycles_active.avg / .min and
    sm__cycles_elapsed.max)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    out = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("ID", "").isdigit():
            continue  # the units row
        kernel = re.sub(r"^void\s+", "", row["Kernel Name"]).split("(")[0].split("<")[0]
        kernel = kernel.split("::")[-1]
        extra = {}
        if number(row, "dram__bytes_read.sum") is not None:
            extra["dram"] = number(row, "dram__bytes_read.sum")
        elapsed = number(row, "sm__cycles_elapsed.max")
        if elapsed and number(row, "sm__cycles_active.avg") is not None:
            extra["busy"] = number(row, "sm__cycles_active.avg") / elapsed
            extra["first"] = number(row, "sm__cycles_active.min") / elapsed
        out.append((kernel, number(row, "gpu__time_duration.sum") / 1000.0, extra))
    return out


def split_launches(launches):
    """{kernel: {"long": [(us, extra)], "short": [...]}}. A launch is long when it takes more than
    half its kernel's longest launch and some launch of the kernel takes less. The long attention
    launches are the dense ones; a merge launch takes the class of the attention launch before it;
    other kernels (scoring) have long launches that scan and short ones that return early (a kept
    selection)."""
    longest, shortest = {}, {}
    for kernel, us, _ in launches:
        longest[kernel] = max(longest.get(kernel, 0.0), us)
        shortest[kernel] = min(shortest.get(kernel, us), us)
    by = {}
    last_attention = "short"
    for kernel, us, extra in launches:
        # One cluster (no launch under half the longest): every launch counts as short.
        two = shortest[kernel] <= 0.5 * longest[kernel]
        cls = "long" if two and us > 0.5 * longest[kernel] else "short"
        if "attention" in kernel:
            last_attention = cls
        elif "merge" in kernel:
            cls = last_attention
        by.setdefault(kernel, {"long": [], "short": []})[cls].append((us, extra))
    return by


def describe(rows):
    med = statistics.median(us for us, _ in rows)
    out = f"x{len(rows)} {med:.1f} us"
    dram = [x["dram"] for _, x in rows if "dram" in x]
    if dram:
        out += f" {statistics.median(dram) / 1e6:.1f} MB"
    busy = [x["busy"] for _, x in rows if "busy" in x]
    if busy:
        first = statistics.median(x["first"] for _, x in rows if "first" in x)
        out += f" SMs busy {100 * statistics.median(busy):.1f} % (first done {100 * first:.0f} %)"
    return out


def read_members(path):
    """[(file name, text)] of a .tgz of CSVs, or of one CSV."""
    if path.endswith((".tgz", ".tar.gz")):
        with tarfile.open(path) as tar:
            return [(m.name.split("/")[-1], tar.extractfile(m).read().decode())
                    for m in tar.getmembers() if m.isfile() and m.name.endswith(".csv")]
    with open(path) as f:
        return [(path.split("/")[-1], f.read())]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+", help="ncu.tgz archives or ncu_*.csv files")
    ap.add_argument("--chunk-bytes", default="",
                    help="geo=bytes,... overriding the K/V bytes per chunk of the budget")
    args = ap.parse_args(argv)
    chunk_bytes = dict(CHUNK_BYTES)
    for item in filter(None, args.chunk_bytes.split(",")):
        geo, value = item.split("=")
        chunk_bytes[geo] = int(value)
    series = {}  # (geo, tag) -> [(budget, attention + merge us)]
    for path in args.inputs:
        for name, text in sorted(read_members(path)):
            by = split_launches(read_csv(text))
            parts = []
            for kernel, cls in sorted(by.items()):
                dense = "attention" in kernel or "merge" in kernel
                for key, label in (("short", "cisa" if dense else "short"),
                                   ("long", "dense" if dense else "long")):
                    if cls[key]:
                        parts.append(f"{kernel} {label} {describe(cls[key])}")
            print(f"{name:28s} " + "; ".join(parts))
            m = NAME.search(name)
            if m and any("attention" in k and by[k]["short"] for k in by):
                geo = f"{m.group(1)}:{m.group(2)}"
                total = sum(statistics.median(us for us, _ in by[k]["short"]) for k in by
                            if ("attention" in k or "merge" in k) and by[k]["short"])
                series.setdefault((geo, m.group(4) or ""), []).append((int(m.group(3)), total))
    for (geo, tag), points in sorted(series.items()):
        if len({b for b, _ in points}) < 2:
            continue
        b0, slope = line_fit(points)
        rate = ""
        if geo in chunk_bytes:
            rate = f", chunks at {chunk_bytes[geo] / slope / 1e6:.2f} TB/s"
        print(f"in-kernel fit {geo} {tag or 'default':12s} budgets {sorted(b for b, _ in points)}: "
              f"attention + merge = {b0:.1f} us + {slope * 1000:.2f} ns per chunk{rate}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
