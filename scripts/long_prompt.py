#!/usr/bin/env python3
"""Writes the main job's long-context prompt: a pass key stated early in a public-domain text
(the King James Bible, Debian package bible-kjv), asked for at the end.

  python3 scripts/long_prompt.py [--tokens 16000] [--depth 0.05] [--seed 7] > prompt.txt

--tokens is approximate (about 4 characters per token); `cisa run` prints the exact count.
The expected answer is printed to stderr.
"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eval_texts  # noqa: E402  (reads the Bible through the `bible` command)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16000, help="approximate prompt length in tokens")
    ap.add_argument("--depth", type=float, default=0.05, help="where the pass key sits (0 = start, 1 = end)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    if args.tokens < 200 or not 0 <= args.depth <= 1:
        ap.error("need --tokens >= 200 and 0 <= --depth <= 1")
    key = random.Random(args.seed).randint(10000, 99999)
    text = eval_texts.kjv()
    budget = args.tokens * 4
    hay = text[:budget]
    cut = hay.rfind("\n", 0, int(len(hay) * args.depth)) + 1
    needle = "The pass key is %d. Remember it. %d is the pass key.\n" % (key, key)
    question = "\nWhat is the pass key? The pass key is"
    sys.stdout.write(hay[:cut] + needle + hay[cut:].rstrip() + "\n" + question)
    sys.stderr.write("expected answer: %d\n" % key)


if __name__ == "__main__":
    main()
