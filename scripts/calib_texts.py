#!/usr/bin/env python3
"""Public-domain calibration and diagnostic texts from Debian packages (docs/calibration.md).

Sources (both installed by apt):
  r-cran-janeaustenr  the six Jane Austen novels (read through Rscript's janeaustenr::austen_books()),
  bible-kjv           the King James Bible (read through the `bible` command; verse labels removed).

Writes one UTF-8 text file per document: a contiguous slice of --chars characters of one source,
cut at line boundaries, starting --skip characters in (past title pages). The calibration set is
the six novels plus Genesis and Exodus (8 documents); --held-out writes documents from other parts
(the end of Emma, Leviticus/Numbers) that calibration never saw, for `cisa diagnose`.

    python3 scripts/calib_texts.py --out calib-texts            # calib-texts/calib-*.txt
    python3 scripts/calib_texts.py --out calib-texts --held-out # calib-texts/heldout-*.txt
"""
import argparse
import os
import re
import subprocess
import sys

BOOKS = ["Sense & Sensibility", "Pride & Prejudice", "Mansfield Park", "Emma", "Northanger Abbey", "Persuasion"]
CALIB_KJV = [("genesis", "Genesis1:1-50:26"), ("exodus", "Exodus1:1-40:38")]
HELDOUT_KJV = [("leviticus-numbers", "Leviticus1:1-27:34", "Numbers1:1-36:13")]


def austen_books():
    script = (
        "library(janeaustenr); b <- austen_books(); "
        "for (n in levels(b$book)) { cat('\\x01', n, '\\n', sep=''); cat(b$text[b$book == n], sep='\\n') }"
    )
    out = subprocess.run(["Rscript", "-e", script], check=True, capture_output=True).stdout.decode("utf-8")
    books = {}
    for part in out.split("\x01")[1:]:
        name, _, text = part.partition("\n")
        books[name] = text
    missing = [b for b in BOOKS if b not in books]
    if missing:
        sys.exit(f"janeaustenr did not return {missing}")
    return books


def kjv(*specs):
    text = []
    for spec in specs:
        out = subprocess.run(["bible", "-f", spec], check=True, capture_output=True, stdin=subprocess.DEVNULL)
        for line in out.stdout.decode("utf-8").splitlines():
            m = re.match(r"^[0-9A-Za-z]+\d+:\d+ (.*)$", line)
            if m:
                text.append(m.group(1))
            elif line.strip() and not line.startswith("bible("):
                text.append(line.strip())
    return "\n".join(text) + "\n"


def cut(text, skip, chars, name):
    start = text.find("\n", skip) + 1 if skip else 0
    if len(text) - start < chars:
        sys.exit(f"{name}: only {len(text) - start} characters after {skip}, need {chars}")
    end = text.rfind("\n", start, start + chars) + 1
    return text[start:end]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--chars", type=int, default=100_000, help="characters per document (default 100000)")
    ap.add_argument("--skip", type=int, default=2_000, help="characters skipped at a source's start")
    ap.add_argument("--held-out", action="store_true", help="write the held-out documents instead")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    docs = []
    books = austen_books()
    if args.held_out:
        emma = books["Emma"]
        docs.append(("heldout-emma-end", emma[len(emma) - args.chars - 1000 :]))
        for name, *specs in HELDOUT_KJV:
            docs.append((f"heldout-{name}", kjv(*specs)))
        prefix_skip = 0
    else:
        for b in BOOKS:
            slug = re.sub(r"[^a-z]+", "-", b.lower()).strip("-")
            docs.append((f"calib-{slug}", books[b]))
        for name, spec in CALIB_KJV:
            docs.append((f"calib-{name}", kjv(spec)))
        prefix_skip = args.skip
    for name, text in docs:
        piece = cut(text, prefix_skip, args.chars, name)
        path = os.path.join(args.out, name + ".txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(piece)
        print(f"{path}: {len(piece)} characters")


if __name__ == "__main__":
    main()
