#!/usr/bin/env python3
"""Writes configs/demo.jsonl and configs/demo-val.jsonl, the embedded demo's task.

Each prompt holds one lowercase letter and one digit in either order; the answer is the letter in capitals and
the digit plus one (9 gives 0): "Q: 2k\\nA:" -> " K3". The 520 prompts are shuffled with a fixed seed and split
440 / 80, so the validation prompts are pairs the training never shows, while every letter and digit appears in
training: learning the rule, not the pairs, is what lowers the validation loss.
"""
import json
import os
import random

LETTERS = "abcdefghijklmnopqrstuvwxyz"
DIGITS = "0123456789"


def record(letter, digit, letter_first):
    shown = letter + digit if letter_first else digit + letter
    answer = letter.upper() + str((int(digit) + 1) % 10)
    return {"prompt": f"Q: {shown}\nA:", "completion": f" {answer}"}


def main():
    pairs = [(l, d, first) for l in LETTERS for d in DIGITS for first in (True, False)]
    random.Random(5).shuffle(pairs)
    here = os.path.dirname(os.path.abspath(__file__))
    for name, part in (("demo.jsonl", pairs[:440]), ("demo-val.jsonl", pairs[440:])):
        with open(os.path.join(here, name), "w") as f:
            for p in part:
                f.write(json.dumps(record(*p)) + "\n")


if __name__ == "__main__":
    main()
