#!/usr/bin/env python3
"""Long chat prompts for the serving verbosity measurement (docs/server.md), one per line.

  python3 bench/serve/make_chat_prompts.py --texts .cache/eval_texts --words 5000 -n 32 -o prompts.txt

Each prompt is a slice of one of the haystack books (scripts/eval_texts.py), chosen by a seeded
generator, followed by a question an instruction-tuned model answers in free text and then ends
with its end-of-turn token, so the output length is the model's own (with `cisa bench serve
--honor-eos --endpoint chat --prompt-file`). Line breaks inside a slice become spaces, since the
file holds one prompt per line. About 1.3 tokens per word for English with SmolLM2's and Gemma's
tokenizers, so --words 5000 gives prompts of roughly 6,500 tokens.
"""
import argparse
import os
import random
import sys

QUESTIONS = [
    "Summarise the passage above in a few sentences.",
    "Who are the people in the passage above, and what do they want?",
    "What happens in the passage above? Answer briefly.",
    "Describe the mood of the passage above and quote one sentence that shows it.",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", required=True, help="folder of .txt books (scripts/eval_texts.py)")
    ap.add_argument("--words", type=int, default=5000, help="words per passage (default 5000)")
    ap.add_argument("-n", type=int, default=32, help="prompts (default 32)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    if a.words < 10 or a.n < 1:
        sys.exit("make_chat_prompts.py: --words must be >= 10 and -n >= 1")
    books = []
    for name in sorted(os.listdir(a.texts)):
        if name.endswith(".txt"):
            with open(os.path.join(a.texts, name), encoding="utf-8") as f:
                words = f.read().split()
            if len(words) > a.words:
                books.append(words)
    if not books:
        sys.exit("make_chat_prompts.py: no book in %s has more than %d words" % (a.texts, a.words))
    rng = random.Random(a.seed)
    with open(a.output, "w", encoding="utf-8") as out:
        for i in range(a.n):
            words = books[rng.randrange(len(books))]
            start = rng.randrange(len(words) - a.words)
            passage = " ".join(words[start:start + a.words])
            out.write("%s %s\n" % (passage, QUESTIONS[i % len(QUESTIONS)]))
    print(a.output)


if __name__ == "__main__":
    main()
