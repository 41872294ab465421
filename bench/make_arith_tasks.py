#!/usr/bin/env python3
"""Writes the 64 arithmetic tasks of the GRPO-at-135M benchmark (bench/README.md, "GRPO at 135M
against TRL with its defaults") in stoke's task JSONL: {"id", "prompt", "answer"}, questions
"What is A op B? Give the final answer after ####." with A, B in 2..60 and op in plus, minus,
times, drawn from random.Random(0). No dependencies.

    python3 bench/make_arith_tasks.py $SCRATCH/grpo19/tasks.jsonl
"""

import json
import random
import sys


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "tasks.jsonl"
    r = random.Random(0)
    with open(out, "w") as f:
        for i in range(64):
            a, b = r.randint(2, 60), r.randint(2, 60)
            op = r.choice(["+", "-", "*"])
            answer = a + b if op == "+" else a - b if op == "-" else a * b
            word = {"+": "plus", "-": "minus", "*": "times"}[op]
            prompt = f"What is {a} {word} {b}? Give the final answer after ####."
            f.write(json.dumps({"id": f"arith-{i}", "prompt": prompt, "answer": str(answer)}) + "\n")
    print(f"wrote 64 tasks to {out}")


if __name__ == "__main__":
    main()
