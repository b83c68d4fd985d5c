#!/usr/bin/env python3
"""bench/python/ncu_kernel_fit.py (ctest scripts_ncu_kernel_fit_test) on synthetic ncu CSVs
whose answers are written out here by hand.

Three files of 4:1 at budgets 1000, 2000 and 4000, in ncu's --csv --page raw layout (a units row,
thousands separators): two dense attention launches of 2,000 us, each followed by a merge of
6 us, then CISA attention launches on the line 10 us + 40 ns per chunk, each followed by a merge
of 5 us. So the CISA attention medians are 50, 90 and 170 us; the fit gives 15.0 us (10 plus
the 5 us merge) + 40.00 ns per chunk, and 131,072 bytes a chunk stream at 131072 / 40e-9 =
3.28 TB/s. A fourth file (another tag, one budget) gives no line. A scoring file shows its
long (scanning) and short (returning at once) launches apart. A balance file (SM active cycles
avg 900 and min 750 over 1,000 elapsed) prints the SMs busy 90.0 % and the least busy at 75 %.
"""
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "bench", "python", "ncu_kernel_fit.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import ncu_kernel_fit  # noqa: E402

HEADER = '"ID","Process ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum"\n'
UNITS = '"","","","nsecond","byte"\n'


def csv_text(launches):
    rows = [f'"{i}","1","void ns::{k}<128, 4>(Args)","{ns:,}","{b:,}"'
            for i, (k, ns, b) in enumerate(launches)]
    return "==PROF== Connected\nsome bench output\n" + HEADER + UNITS + "\n".join(rows) + "\n"


def attention_file(budget):
    us = 10 + 0.04 * budget
    launches = [("attention_kernel", 2_000_000, 10**9), ("merge_kernel", 6000, 10**5)] * 2
    launches += [("attention_kernel", int(us * 1000), 10**8), ("merge_kernel", 5000, 10**5)] * 3
    return csv_text(launches)


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def main():
    files = {f"ncu_4x1_{b}.csv": attention_file(b) for b in (1000, 2000, 4000)}
    files["ncu_4x1_4096_fm.csv"] = attention_file(4096)
    files["ncu_balance_4x1.csv"] = (
        "==PROF== Connected\n"
        '"ID","Kernel Name","gpu__time_duration.sum","sm__cycles_active.avg",'
        '"sm__cycles_active.min","sm__cycles_elapsed.max"\n'
        '"","","nsecond","cycle","cycle","cycle"\n'
        '"0","void attention_kernel<1>(A)","186,000","900","750","1,000"\n')
    files["ncu_4x1_cisa.csv"] = csv_text([("score_few_kernel", 55_500, 139_000_000)] * 3 +
                                         [("score_few_kernel", 7_400, 2_100_000)] * 2)
    with tempfile.TemporaryDirectory() as tmp:
        archive = os.path.join(tmp, "ncu.tgz")
        with tarfile.open(archive, "w:gz") as tar:
            for name, text in files.items():
                data = text.encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        out = io.StringIO()
        with redirect_stdout(out):
            check(ncu_kernel_fit.main([archive]) == 0, "exit status")
        text = out.getvalue()
        print(text)
        line = next(l for l in text.splitlines() if l.startswith("ncu_4x1_2000.csv"))
        check("attention_kernel cisa x3 90.0 us 100.0 MB" in line, "CISA attention median")
        check("attention_kernel dense x2 2000.0 us" in line, "dense attention launches apart")
        check("merge_kernel cisa x3 5.0 us" in line and "merge_kernel dense x2 6.0 us" in line,
              "merges take the class of the attention before them")
        fit = [l for l in text.splitlines() if l.startswith("in-kernel fit")]
        check(len(fit) == 1, "one line: the one-budget tag gives none")
        check("attention + merge = 15.0 us + 40.00 ns per chunk, chunks at 3.28 TB/s" in fit[0],
              "the fitted line")
        score = next(l for l in text.splitlines() if l.startswith("ncu_4x1_cisa.csv"))
        check("score_few_kernel short x2 7.4 us 2.1 MB" in score and
              "score_few_kernel long x3 55.5 us 139.0 MB" in score, "scoring launches apart")
        bal = next(l for l in text.splitlines() if l.startswith("ncu_balance_4x1.csv"))
        check("attention_kernel cisa x1 186.0 us SMs busy 90.0 % (first done 75 %)" in bal,
              "SM balance")
        cli = subprocess.run([sys.executable, SCRIPT, archive], capture_output=True, text=True)
        check(cli.returncode == 0 and cli.stdout == text, "the command line prints the same")
    print("ok")


if __name__ == "__main__":
    main()
