#!/usr/bin/env python3
"""Paired change of each configuration against a base configuration of the same cisa eval run
(RULER-style task scores), stratified by task as the run's summary does against dense: the
statistic is the mean over tasks of the per-task mean difference on the same prompts, with a 95%
percentile bootstrap (2000 resamples of the examples within each task). Long documents (task
`doc`), where the run has them: KL(dense || config) of each configuration over that of the base on
the same documents (ratio of the mean KL per token, 95% percentile bootstrap over documents) and
the number of documents where the configuration's KL is the larger.

  python3 bench/eval/paired_vs_config.py RUN_DIR --base cisa:x8:g4:s1:cal [--configs A,B]
"""
import argparse
import collections
import json
import random


def doc_kl_rows(docs, base, configs, rng):
    """(config, length, documents, ratio, low, high, larger) per configuration and length: KL of
    each configuration against the base's on the same documents (see the docstring)."""
    kl = collections.defaultdict(dict)  # (config, length) -> {document id: (KL sum, positions)}
    for r in docs:
        if r["config"] != "dense":
            kl[(r["config"], r["length"])][r["id"]] = (sum(r["kl"]), len(r["kl"]))
    names = configs.split(",") if configs else sorted({c for c, _ in kl} - {base})
    out = []
    for cfg in names:
        for length in sorted({n for _, n in kl}):
            b, c = kl.get((base, length), {}), kl.get((cfg, length), {})
            ids = sorted(set(b) & set(c))
            if not ids:
                continue
            ratio = lambda s: (sum(c[i][0] for i in s) / sum(c[i][1] for i in s)) / (
                sum(b[i][0] for i in s) / sum(b[i][1] for i in s))
            boot = sorted(ratio([rng.choice(ids) for _ in ids]) for _ in range(2000))
            larger = sum(c[i][0] / c[i][1] > b[i][0] / b[i][1] for i in ids)
            out.append((cfg, length, len(ids), ratio(ids), boot[50], boot[1949], larger))
    return out


def doc_kl_table(docs, base, configs, rng):
    print("| config | length | docs | KL / KL of %s | documents with the larger KL |" % base)
    print("|---|---|---|---|---|")
    for cfg, length, n, r, lo, hi, larger in doc_kl_rows(docs, base, configs, rng):
        print("| %s | %d | %d | %.2f [%.2f, %.2f] | %d / %d |" % (cfg, length, n, r, lo, hi, larger, n))
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--base", required=True)
    ap.add_argument("--configs", default="", help="comma-separated; default every other config")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(a.run_dir + "/results.jsonl")]
    docs = [r for r in rows if r["task"] == "doc"]
    rows = [r for r in rows if r["task"] != "doc"]
    if docs:
        doc_kl_table(docs, a.base, a.configs, random.Random(a.seed))
    if not rows:
        return
    by = collections.defaultdict(dict)
    for r in rows:
        by[r["id"]][r["config"]] = r
    configs = a.configs.split(",") if a.configs else sorted({r["config"] for r in rows} - {a.base})
    lengths = sorted({r["length"] for r in rows})
    rng = random.Random(a.seed)
    print("| config | length | Δ vs %s (points) | same prediction |" % a.base)
    print("|---|---|---|---|")
    for cfg in configs:
        for length in lengths:
            tasks = collections.defaultdict(list)
            same = n = 0
            for d in by.values():
                if cfg in d and a.base in d and d[a.base]["length"] == length:
                    tasks[d[a.base]["task"]].append(100 * (d[cfg]["score"] - d[a.base]["score"]))
                    same += d[cfg]["prediction"] == d[a.base]["prediction"]
                    n += 1
            if not tasks:
                continue
            stat = lambda t: sum(sum(v) / len(v) for v in t.values()) / len(t)
            boot = sorted(stat({k: [rng.choice(v) for _ in v] for k, v in tasks.items()})
                          for _ in range(2000))
            print("| %s | %d | %+.1f [%+.1f, %+.1f] | %d / %d |" %
                  (cfg, length, stat(tasks), boot[50], boot[1949], same, n))


if __name__ == "__main__":
    main()
