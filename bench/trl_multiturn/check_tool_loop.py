#!/usr/bin/env python3
"""One pass through TRL's tool loop (GRPOTrainer._tool_call_loop) with a hand-written first turn that calls the
calculator, on the benchmark's template, parser and tool: checks that TRL runs the tool, appends the tool turn as ids
(no re-tokenization of the model's turn), masks it, and samples the next turn. The untrained SmolLM2-135M-Instruct
never calls the tool by itself, so the benchmark run alone does not reach this code.

    $VENV/bin/python check_tool_loop.py --model M --tasks tasks.jsonl
"""
import argparse, json, os, sys, tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
import trl_multiturn_grpo as bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tasks", type=Path, required=True)
    ap.add_argument("--max-turn-tokens", type=int, default=24)
    args = ap.parse_args()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import parse_response, qwen3_template

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(args.model)
    tok.padding_side = "left"
    tok.chat_template = bench.SMOLLM2_TOOLS_TEMPLATE
    tok.response_template = qwen3_template
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    task = bench.load_tasks(args.tasks)[0]
    prompt = [{"role": "system", "content": bench.CALCULATOR_SYSTEM_PROMPT}, {"role": "user", "content": task["prompt"]}]
    config = GRPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, per_device_train_batch_size=2, num_generations=2,
                        max_completion_length=576, generation_kwargs={"max_new_tokens": args.max_turn_tokens},
                        max_tool_calling_iterations=2, report_to="none", max_steps=1)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=config,
                          train_dataset=Dataset.from_list([{"prompt": prompt}] * 2), processing_class=tok,
                          tools=[bench.calculator])
    trainer._sync_tool_dicts, trainer._async_tool_dicts = [{"calculator": bench.calculator}], [{}]
    prompt_ids = tok.apply_chat_template(prompt, tools=[bench.calculator], add_generation_prompt=True, tokenize=True,
                                         return_dict=False)
    expression = task["prompt"].removeprefix("What is ").removesuffix("?")
    first = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call><|im_end|>' % expression
    first_ids = tok(first, add_special_tokens=False).input_ids
    completions = [[parse_response(tok, first_ids, prefix=prompt_ids, tools=[bench.calculator])]]
    mask, completions, completion_ids, _lp, calls, failures, _img = trainer._tool_call_loop(
        [list(prompt)], [prompt_ids], [list(first_ids)], completions, None, None, {})
    ids, mask = completion_ids[0], mask[0]
    tool_ids = [i for i, m in zip(ids, mask) if m == 0]
    stoke_segment = f"\n<|im_start|>tool\n{task['answer']}<|im_end|>\n<|im_start|>assistant\n"
    print(json.dumps({
        "tool_calls": calls, "tool_failures": failures, "tool_stats": bench.TOOL_STATS,
        "first_turn_kept_as_ids": ids[:len(first_ids)] == first_ids,
        "masked_text": tok.decode(tool_ids),
        "masked_ids_equal_stoke_segment": tool_ids == tok(stoke_segment, add_special_tokens=False).input_ids,
        "second_turn": tok.decode(ids[len(first_ids) + len(tool_ids):]),
        "messages": completions[0],
    }, indent=1))


if __name__ == "__main__":
    main()
