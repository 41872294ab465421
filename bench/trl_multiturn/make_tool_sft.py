#!/usr/bin/env python3
"""SFT data that teaches SmolLM2-135M-Instruct to call the calculator tool, so that the multi-turn GRPO
benchmark has multi-turn episodes (the instruct model alone never calls the tool: 1 turn, 0 tool calls).

One chat line per task, the ideal trace of stoke_env::arithmetic::tool_use_trace with the calculator
environment's system prompt (what stoke and trl_multiturn_grpo.py show the model):
  system    CALCULATOR_SYSTEM_PROMPT
  user      What is 462 * 172?
  assistant <tool_call>{"name": "calculator", "arguments": {"expression":"462 * 172"}}</tool_call>
  tool      79464
  assistant The answer is 79464.
Operands of --digits digits, ops `*`, `+`, `a * b - c` as stoke's generator, drawn with Python's RNG from
--seed (not stoke's ChaCha stream: these are training traces, not the benchmark's tasks).

    python3 make_tool_sft.py --out $SCRATCH/trl_multiturn/tool_sft.jsonl --count 2000
"""

import argparse
import json
import random

SYSTEM = (
    "You can use a calculator. To call it, write "
    '<tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call> '
    "and wait for the result. Then give the final answer as a number."
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--digits", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    low, high = 10 ** (args.digits - 1), 10**args.digits - 1
    with open(args.out, "w") as out:
        for _ in range(args.count):
            a, b = rng.randint(low, high), rng.randint(low, high)
            op = rng.randrange(3)
            if op == 0:
                expression, value = f"{a} * {b}", a * b
            elif op == 1:
                expression, value = f"{a} + {b}", a + b
            else:
                c = rng.randint(low, high)
                expression, value = f"{a} * {b} - {c}", a * b - c
            arguments = json.dumps({"expression": expression}, separators=(",", ":"))
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"What is {expression}?"},
                {"role": "assistant",
                 "content": f'<tool_call>{{"name": "calculator", "arguments": {arguments}}}</tool_call>'},
                {"role": "tool", "content": str(value)},
                {"role": "assistant", "content": f"The answer is {value}."},
            ]
            out.write(json.dumps({"messages": messages}) + "\n")
    print(f"wrote {args.count} traces to {args.out}")


if __name__ == "__main__":
    main()
