#!/usr/bin/env python3
"""Writes the tasks of the `stoke eval` speed comparison with lm-evaluation-harness (by hand,
never in CI): a four-way multiple-choice task (log-likelihood; arithmetic questions from a fixed
seed) and a short generative task (greedy, exact match), each as a stoke task file and as an
lm-eval task YAML over the same JSONL data, into DIR. Prints the two command pairs to time.

    python3 bench/eval_speed.py DIR --model $SCRATCH/smollm2/hf --items 100

Pinned for the comparison: lm-eval 0.4.13, transformers 5.24.0, torch 2.15.0.
"""

import argparse
import json
import random
from pathlib import Path

MC_YAML = """task: speed_mc
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

GEN_YAML = """task: speed_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: answer
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 16
  do_sample: false
metric_list:
  - metric: exact_match
metadata:
  version: 1
"""

MC_TOML = """output_type = "multiple_choice"
data = "speed.jsonl"
doc_to_text = "Question: {{question}}\\nAnswer:"
doc_to_choice = "choices"
doc_to_target = "gold"
"""

GEN_TOML = """output_type = "generate_until"
data = "speed.jsonl"
doc_to_text = "Question: {{question}}\\nAnswer:"
doc_to_target = "answer"
[generation]
max_tokens = 16
stop = ["\\n"]
[grader]
kind = "exact_match"
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--model", required=True)
    parser.add_argument("--items", type=int, default=100)
    args = parser.parse_args()
    out = Path(args.dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    lines = []
    for _ in range(args.items):
        a, b = rng.randrange(2, 60), rng.randrange(2, 60)
        right = a + b
        wrong = set()
        while len(wrong) < 3:
            w = right + rng.choice([-10, -2, -1, 1, 2, 3, 10])
            if w > 0 and w != right:
                wrong.add(w)
        choices = [str(x) for x in [right, *sorted(wrong)]]
        rng.shuffle(choices)
        lines.append(json.dumps({"question": f"What is {a} plus {b}?", "choices": choices,
                                 "gold": choices.index(str(right)), "answer": str(right)}))
    data = out / "speed.jsonl"
    data.write_text("\n".join(lines) + "\n")
    (out / "speed_mc.yaml").write_text(MC_YAML.format(data=data))
    (out / "speed_gen.yaml").write_text(GEN_YAML.format(data=data))
    (out / "mc.toml").write_text(MC_TOML)
    (out / "gen.toml").write_text(GEN_TOML)
    for kind in ["mc", "gen"]:
        print(f"stoke eval run --task {out}/{kind}.toml --model {args.model} --out {out}/stoke-{kind}-$RUN")
        print(f"lm_eval --model hf --model_args pretrained={args.model} --include_path {out} "
              f"--tasks speed_{kind} --device cpu --output_path {out}/lm-eval-{kind}")


if __name__ == "__main__":
    main()
