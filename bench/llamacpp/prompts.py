#!/usr/bin/env python3
"""Writes the 20 prose prompts of the numerics comparison (bench/llamacpp/README.md).

The text is Jane Austen's six novels (1811-1818, public domain) as shipped by Debian's
r-cran-janeaustenr 1.0.0-1 (read as tests/golden/scripts/make_llamacpp_fixtures.py reads it):

    apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb /tmp/janeausten
    pip install rdata==1.1.0
    python3 bench/llamacpp/prompts.py --janeausten-dir /tmp/janeausten --out /tmp/h11/prompts

Prompt i (0..19) has round(12 * 200^(i/19)) words (12 to 2,400, evenly spaced in log scale), from
novel i mod 6, starting at the first line at or after fraction (0.05 + 0.9 * ((i * 7) mod 20) / 20)
of the novel that begins a paragraph (follows an empty line); the novel's lines are joined with
"\\n" and the prompt ends after its last word (no trailing whitespace). Files: p00.txt .. p19.txt
and index.json (name, words, novel, line).

With --serve-lines N it also writes serve_prompts.txt for bench/llamacpp/serve_compare.py: N
one-line prompts of 96 words each (line breaks replaced by spaces), prompt j from novel j mod 6 at
fraction 0.1 + 0.8 * j / N of it, each starting a paragraph (so no two share a prefix).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

_ROOT = pathlib.Path(__file__).resolve().parents[2]
for _d in ("tests/golden/scripts", "scripts"):  # where the fixture writer lives (it has moved)
    if (_ROOT / _d / "make_llamacpp_fixtures.py").exists():
        sys.path.insert(0, str(_ROOT / _d))
        break
from make_llamacpp_fixtures import load_austen  # noqa: E402

NOVELS = ["prideprejudice", "emma", "persuasion", "sensesensibility", "mansfieldpark",
          "northangerabbey"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--janeausten-dir", default="/tmp/janeausten")
    ap.add_argument("--out", required=True)
    ap.add_argument("--serve-lines", type=int, default=0)
    args = ap.parse_args()
    books = load_austen(pathlib.Path(args.janeausten_dir))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    index = []
    for i in range(20):
        words = round(12 * 200 ** (i / 19))
        novel = NOVELS[i % 6]
        lines = books[novel]
        frac = 0.05 + 0.9 * ((i * 7) % 20) / 20
        start = int(frac * len(lines))
        while start < len(lines) and not (lines[start].strip() and not lines[start - 1].strip()):
            start += 1
        text = "\n".join(lines[start:])
        # Cut after `words` whitespace-separated words, keeping the original line breaks.
        spans = [m.end() for m in re.finditer(r"\S+", text)]
        if len(spans) < words:
            raise SystemExit(f"prompt {i}: the novel has too few words after line {start}")
        prompt = text[:spans[words - 1]]
        (out / f"p{i:02d}.txt").write_text(prompt, encoding="utf-8")
        index.append({"name": f"p{i:02d}", "words": words, "novel": novel, "line": start,
                      "chars": len(prompt)})
    (out / "index.json").write_text(json.dumps({
        "source": "Debian r-cran-janeaustenr 1.0.0-1 (janeaustenr/data/Rdata.rdb), Jane Austen's "
                  "novels, public domain",
        "prompts": index}, indent=1) + "\n")
    serve = []
    for j in range(args.serve_lines):
        lines = books[NOVELS[j % 6]]
        start = int((0.1 + 0.8 * j / args.serve_lines) * len(lines))
        while start < len(lines) and not (lines[start].strip() and not lines[start - 1].strip()):
            start += 1
        serve.append(" ".join(" ".join(lines[start:start + 40]).split()[:96]))
    if serve:
        (out / "serve_prompts.txt").write_text("\n".join(serve) + "\n", encoding="utf-8")
    print(f"wrote {len(index)} prompts to {out}: words {[p['words'] for p in index]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
