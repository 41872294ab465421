#!/usr/bin/env python3
"""Writes arithmetic preference pairs for the "stoke dpo vs TRL DPOTrainer" benchmark (bench/dpo_trl.py).

Each line is one pair in TRL's conversational preference format:
    {"prompt":   [{"role": "user", "content": "<word problem>"}],
     "chosen":   [{"role": "assistant", "content": "<worked answer, right>"}],
     "rejected": [{"role": "assistant", "content": "<worked answer, one slip>"}]}

A problem is a short word problem (shopping change, boxes, savings, pages, travel, chairs, sharing)
solved in two or three arithmetic steps. The chosen reply works it out and ends on `#### <answer>`
(the GSM8K form stoke's verifier reads). The rejected reply is the same text with one plausible
slip: one step's result is off (by 1, 2 or 10, or two digits swapped) and the later steps carry the
wrong value on, so it is internally consistent after the slip and ends on a wrong final answer.
Chosen and rejected differ only in a few number tokens and are about 40-80 tokens each with the
SmolLM2 tokenizer. Deterministic from --seed (random.Random); standard library only.

    python3 bench/make_pairs.py --out $SCRATCH/dpo_pairs.jsonl --n 256 --seed 0
"""

from __future__ import annotations

import argparse
import json
import random

NAMES = ["Mia", "Leo", "Ava", "Noah", "Emma", "Liam", "Zoe", "Omar", "Nina", "Ravi", "Sara", "Tom", "Ines", "Kenji"]


class Work:
    """Does the arithmetic of one solution; step `slip_step` gets the wrong result (the later steps use it)."""

    def __init__(self, slip_step: int | None, slip_kind: str):
        self.slip_step, self.slip_kind, self.step = slip_step, slip_kind, 0
        self.exact = True  # every division came out whole

    def calc(self, a: int, op: str, b: int) -> tuple[int, str]:
        true = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
        self.exact = self.exact and (op != "/" or a % b == 0)
        value = true
        if self.step == self.slip_step:
            value = slipped(true, self.slip_kind)
        self.step += 1
        return value, f"{a} {op} {b} = {value}"


def slipped(value: int, kind: str) -> int:
    """A wrong value a careless solver writes for `value` (never `value` itself, never below 1)."""
    digits = str(value)
    if kind == "swap" and len(digits) >= 2 and digits[-1] != digits[-2] and (len(digits) > 2 or digits[-1] != "0"):
        return int(digits[:-2] + digits[-1] + digits[-2])
    delta = {"swap": 1, "one": 1, "two": 2, "ten": 10}[kind]
    return value + delta if value - delta < 1 or (value + len(digits)) % 2 else value - delta


def shopping(rng: random.Random, w: Work) -> tuple[str, str]:
    name, item = rng.choice(NAMES), rng.choice(["notebooks", "apples", "pens", "tickets", "mugs"])
    count, price = rng.randint(3, 9), rng.randint(2, 12)
    paid = next(p for p in (20, 50, 100, 200) if p > count * price + 5)
    question = (f"{name} buys {count} {item} that cost ${price} each and pays with a ${paid} bill. "
                f"How much change does {name} get back?")
    cost, s1 = w.calc(count, "*", price)
    change, s2 = w.calc(paid, "-", cost)
    answer = (f"First find the total cost. {count} {item} at ${price} each cost {s1} dollars. "
              f"{name} pays ${paid}, so the change is {s2} dollars.\n#### {change}")
    return question, answer


def boxes(rng: random.Random, w: Work) -> tuple[str, str]:
    name, item = rng.choice(NAMES), rng.choice(["crayons", "marbles", "stickers", "cookies", "stamps"])
    n, per, given, bought = rng.randint(3, 9), rng.randint(4, 15), rng.randint(2, 12), rng.randint(3, 20)
    question = (f"{name} has {n} boxes with {per} {item} in each box. {name} gives {given} {item} to a friend "
                f"and then buys {bought} more. How many {item} does {name} have now?")
    total, s1 = w.calc(n, "*", per)
    left, s2 = w.calc(total, "-", given)
    now, s3 = w.calc(left, "+", bought)
    answer = (f"{name} starts with {s1} {item}. After giving some away, {name} has {s2}. "
              f"Buying more gives {s3} {item}.\n#### {now}")
    return question, answer


def savings(rng: random.Random, w: Work) -> tuple[str, str]:
    name, thing = rng.choice(NAMES), rng.choice(["bike helmet", "board game", "jacket", "backpack"])
    weekly, weeks = rng.randint(5, 25), rng.randint(4, 12)
    spent = rng.randint(10, weekly * weeks - 5)
    question = (f"{name} saves ${weekly} every week for {weeks} weeks and then spends ${spent} on a {thing}. "
                f"How much money does {name} have left?")
    saved, s1 = w.calc(weekly, "*", weeks)
    left, s2 = w.calc(saved, "-", spent)
    answer = (f"In {weeks} weeks {name} saves {s1} dollars. After buying the {thing}, "
              f"{name} has {s2} dollars left.\n#### {left}")
    return question, answer


def pages(rng: random.Random, w: Work) -> tuple[str, str]:
    name = rng.choice(NAMES)
    per_day, days = rng.randint(8, 30), rng.randint(3, 9)
    book = per_day * days + rng.randint(10, 150)
    question = (f"A book has {book} pages. {name} reads {per_day} pages a day for {days} days. "
                f"How many pages are left to read?")
    read, s1 = w.calc(per_day, "*", days)
    left, s2 = w.calc(book, "-", read)
    answer = (f"{name} reads {s1} pages in {days} days. The book has {book} pages, "
              f"so {s2} pages are left.\n#### {left}")
    return question, answer


def travel(rng: random.Random, w: Work) -> tuple[str, str]:
    vehicle = rng.choice(["train", "bus", "truck", "ferry"])
    speed, hours, extra = rng.randint(3, 9) * 10, rng.randint(2, 6), rng.randint(5, 60)
    question = (f"A {vehicle} travels at {speed} km per hour for {hours} hours and then goes {extra} km more. "
                f"How far does it travel in total?")
    first, s1 = w.calc(speed, "*", hours)
    total, s2 = w.calc(first, "+", extra)
    answer = (f"At {speed} km per hour for {hours} hours the {vehicle} covers {s1} km. "
              f"Adding the last part gives {s2} km.\n#### {total}")
    return question, answer


def chairs(rng: random.Random, w: Work) -> tuple[str, str]:
    rows, per = rng.randint(4, 12), rng.randint(5, 12)
    broken = rng.randint(2, 9)
    students = rng.randint(5, rows * per - broken - 1)
    question = (f"A hall has {rows} rows of {per} chairs. {broken} chairs are broken and {students} students "
                f"sit on the others. How many good chairs are still empty?")
    total, s1 = w.calc(rows, "*", per)
    good, s2 = w.calc(total, "-", broken)
    empty, s3 = w.calc(good, "-", students)
    answer = (f"The hall has {s1} chairs. Without the broken ones there are {s2} good chairs. "
              f"After the students sit, {s3} are empty.\n#### {empty}")
    return question, answer


def sharing(rng: random.Random, w: Work) -> tuple[str, str]:
    name = rng.choice(NAMES)
    trays, per_tray = rng.randint(2, 6), rng.randint(4, 12)
    friends = rng.choice([d for d in range(2, 9) if trays * per_tray % d == 0])
    question = (f"{name} bakes {trays} trays of {per_tray} muffins and shares them equally among {friends} friends. "
                f"How many muffins does each friend get?")
    total, s1 = w.calc(trays, "*", per_tray)
    share, s2 = w.calc(total, "/", friends)
    answer = (f"{name} bakes {s1} muffins in all. Shared among {friends} friends, "
              f"each friend gets {s2} muffins.\n#### {share}")
    return question, answer


TEMPLATES = [shopping, boxes, savings, pages, travel, chairs, sharing]
SLIPS = ["one", "two", "ten", "swap"]


def make_pair(rng: random.Random) -> dict:
    template = rng.choice(TEMPLATES)
    state = rng.getstate()
    question, chosen = template(rng, Work(None, "one"))
    steps = chosen.count(" = ")
    while True:
        slip_step, slip_kind = rng.randrange(steps), rng.choice(SLIPS)
        after = rng.getstate()
        rng.setstate(state)  # the same draws again: the same question, one step slipped
        work = Work(slip_step, slip_kind)
        question_again, rejected = template(rng, work)
        rng.setstate(after)
        assert question_again == question
        final_differs = rejected.rsplit("####", 1)[1] != chosen.rsplit("####", 1)[1]
        if final_differs and work.exact and "= -" not in rejected:
            break
    return {
        "prompt": [{"role": "user", "content": question}],
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSONL to write")
    ap.add_argument("--n", type=int, default=256, help="number of pairs")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with open(args.out, "w") as f:
        for _ in range(args.n):
            f.write(json.dumps(make_pair(rng)) + "\n")
    print(f"wrote {args.n} preference pairs to {args.out}")


if __name__ == "__main__":
    main()
