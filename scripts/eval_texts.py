#!/usr/bin/env python3
"""Extract the public-domain long texts `cisa eval` uses as haystacks and long documents.

Sources (Debian packages, both public domain):
  - r-cran-janeaustenr: the six Jane Austen novels, read through Rscript (the package stores them
    as an R lazy-load database, one line of the printed book per element);
  - bible-kjv: the King James Bible, read through the `bible` command, verse references removed.

Writes one UTF-8 plain-text file per book to OUT_DIR (default: .cache/eval_texts in the source tree, which git ignores):
  austen_emma.txt, austen_mansfieldpark.txt, austen_northangerabbey.txt, austen_persuasion.txt,
  austen_prideprejudice.txt, austen_sensesensibility.txt, kjv.txt
With --install it first runs `apt-get install -y bible-kjv r-cran-janeaustenr` (CI does this).

  python3 scripts/eval_texts.py [--install] [OUT_DIR]
"""
import os
import re
import subprocess
import sys

AUSTEN_BOOKS = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice",
                "sensesensibility"]
VERSE_REF = re.compile(r"^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ ")


def fail(msg):
    sys.stderr.write("eval_texts.py: " + msg + "\n")
    sys.exit(1)


def run(cmd):
    try:
        return subprocess.run(cmd, check=True, capture_output=True).stdout
    except FileNotFoundError:
        fail("'%s' not found; install the Debian packages bible-kjv and r-cran-janeaustenr "
             "(or pass --install)" % cmd[0])
    except subprocess.CalledProcessError as e:
        fail("'%s' failed: %s" % (" ".join(cmd), e.stderr.decode("utf-8", "replace").strip()))


def austen(book):
    # writeLines of the character vector: one printed line per element, blank lines kept.
    script = "library(janeaustenr); writeLines(%s, useBytes = TRUE)" % book
    text = run(["Rscript", "--vanilla", "-e", script]).decode("utf-8", "replace")
    return text.strip() + "\n"


def kjv():
    raw = run(["bible", "-f", "Ge1:1-Re22:21"]).decode("utf-8", "replace")
    verses = [VERSE_REF.sub("", line).strip() for line in raw.splitlines()]
    verses = [v for v in verses if v]
    if len(verses) < 31000:
        fail("the bible command printed only %d verses (expected 31,102)" % len(verses))
    # Verses run on as prose, one paragraph per chapter would need the references; keep one
    # verse per line so that documents stay readable.
    return "\n".join(verses) + "\n"


def main(argv):
    args = [a for a in argv if a != "--install"]
    if len(args) > 1 or any(a.startswith("-") for a in args):
        fail("usage: eval_texts.py [--install] [OUT_DIR]")
    if "--install" in argv:
        subprocess.run(["apt-get", "install", "-y", "-q", "bible-kjv", "r-cran-janeaustenr"],
                       check=True)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = args[0] if args else os.path.join(root, ".cache", "eval_texts")
    os.makedirs(out, exist_ok=True)
    books = [("austen_" + b, lambda b=b: austen(b)) for b in AUSTEN_BOOKS] + [("kjv", kjv)]
    for name, make in books:
        text = make()
        if len(text) < 100000:
            fail("%s is only %d bytes; the package looks incomplete" % (name, len(text)))
        path = os.path.join(out, name + ".txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print("%s: %d bytes" % (path, len(text)))


if __name__ == "__main__":
    main(sys.argv[1:])
