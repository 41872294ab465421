#!/usr/bin/env python3
"""Compatibility check of `stoke serve` with lm-evaluation-harness, by hand (never in CI).

Writes a small local multiple-choice task (arithmetic questions with four numeric answers, from
a fixed seed), runs `lm_eval --model local-completions` against a running `stoke serve`, and
computes the same accuracies without the server: every choice scored with `stoke score --ids`
(the cache-free scorer) on exactly the token ids lm-eval sends (context encoded alone, the
continuation as the rest of the whole string's encoding, as lm-eval's `_encode_pair` does).
Prints both; they must agree.

    target/release/stoke serve --model $SCRATCH/smollm2/hf --served-model-name smollm2 --port 8011 &
    $VENV/bin/python bench/lm_eval_check.py --url http://127.0.0.1:8011 --model smollm2 \
        --model-dir $SCRATCH/smollm2/hf --stoke target/release/stoke --items 40

Pinned: lm-eval 0.4.13 (with its `api` extra), transformers 5.24.0.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
from pathlib import Path

TASK_YAML = """task: stoke_arith_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: choices
doc_to_target: gold
target_delimiter: " "
metric_list:
  - metric: acc
  - metric: acc_norm
metadata:
  version: 1
"""


def make_items(n: int, seed: int):
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        a, b = rng.randrange(2, 30), rng.randrange(2, 30)
        right = a + b
        wrong = set()
        while len(wrong) < 3:
            w = right + rng.choice([-10, -2, -1, 1, 2, 3, 10])
            if w > 0 and w != right:
                wrong.add(w)
        choices = [str(x) for x in [right, *sorted(wrong)]]
        rng.shuffle(choices)
        items.append({"question": f"What is {a} plus {b}?", "choices": choices, "gold": choices.index(str(right))})
    return items


def stoke_scores(stoke: str, model_dir: str, tokenizer, items):
    """acc and acc_norm from `stoke score` on lm-eval's token split."""
    correct = correct_norm = 0
    for item in items:
        context = f"Question: {item['question']}\nAnswer:"
        context_ids = tokenizer.encode(context, add_special_tokens=False)
        scores = []
        for choice in item["choices"]:
            continuation = " " + choice
            whole = tokenizer.encode(context + continuation, add_special_tokens=False)
            # lm-eval: the continuation is what the whole encoding adds to the context's.
            n_cont = len(whole) - len(context_ids)
            out = subprocess.run(
                [stoke, "score", "--model", model_dir, "--ids", ",".join(map(str, whole))],
                check=True, capture_output=True, text=True,
            )
            logprobs = json.loads(out.stdout)["next_token_logprobs"]
            ll = sum(logprobs[len(whole) - 1 - n_cont:])
            # lm-eval's acc_norm divides by the choice's length in characters.
            scores.append((ll, ll / len(choice)))
        correct += max(range(4), key=lambda i: scores[i][0]) == item["gold"]
        correct_norm += max(range(4), key=lambda i: scores[i][1]) == item["gold"]
    return correct / len(items), correct_norm / len(items)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--stoke", default="target/release/stoke")
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    items = make_items(args.items, args.seed)
    work = Path(tempfile.mkdtemp(prefix="stoke-lmeval-"))
    data = work / "data.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    (work / "stoke_arith_mc.yaml").write_text(TASK_YAML.format(data=data))
    out_dir = work / "out"
    subprocess.run(
        [
            "lm_eval", "--model", "local-completions",
            "--model_args",
            f"model={args.model},base_url={args.url}/v1/completions,tokenizer={args.model_dir},"
            "tokenizer_backend=huggingface,num_concurrent=4,max_retries=1",
            "--include_path", str(work), "--tasks", "stoke_arith_mc",
            "--output_path", str(out_dir),
        ],
        check=True,
    )
    result_file = next(out_dir.rglob("results_*.json"))
    results = json.loads(result_file.read_text())["results"]["stoke_arith_mc"]
    acc, acc_norm = stoke_scores(args.stoke, args.model_dir, tokenizer, items)
    print(json.dumps({
        "items": len(items),
        "lm_eval_via_stoke_serve": {"acc": results["acc,none"], "acc_norm": results["acc_norm,none"]},
        "stoke_score": {"acc": acc, "acc_norm": acc_norm},
    }, indent=1))


if __name__ == "__main__":
    main()
