#!/usr/bin/env python3
"""GRPO reference: TRL's GRPOTrainer on a stoke speedrun model and the same arithmetic tasks (issue 6).

What it is: the TRL half of the "stoke grpo vs TRL GRPOTrainer" benchmark. It loads a stoke model
folder (Hugging Face Llama layout with tokenizer files and chat template, e.g. the `model/` of
`stoke speedrun --quick`) with transformers, builds conversational prompts from a task file, scores
completions with the same rule as stoke's `stoke_eval::answer_verifier` (exact match, GSM8K mode:
the number after the completion's last `####`, else the final answer, else the last number), runs
`GRPOTrainer.train()` on the CPU and writes one JSON object with wall-clock per step, samples/s,
completion tokens/s, the share of each step spent generating, and the reward curve.

What it is not: part of CI (it needs the venv with torch / transformers / trl), or a tuned TRL
setup (vLLM, bf16, gradient checkpointing are all off so both sides do the same f32 work).

Settings mirrored from stoke's GRPO config (stoke name -> TRL name):
  group_size 16          -> num_generations 16
  prompts_per_step 8     -> per_device_train_batch_size 128 (TRL counts completions, not prompts),
                            gradient_accumulation_steps 1, so steps_per_generation 1: one
                            generation batch of 8 prompts x 16 samples per optimizer step
  max_new_tokens 48      -> max_completion_length 48
  temperature 1, top_p 1 -> temperature 1.0, top_p 1.0, top_k 0
  beta 0                 -> beta 0.0 (no reference model is loaded)
  loss token-mean        -> loss_type "dapo" (token-mean over the whole batch), epsilon 0.2,
                            scale_rewards "group" (advantage = (r - group mean) / group std)
  AdamW, wd 0, clip 1.0  -> AdamW (torch), weight_decay 0, max_grad_norm 1.0,
  constant lr              lr_scheduler_type "constant", no warmup
  on-policy, one update  -> num_iterations 1 (old log-probs = the current ones, ratio 1)

Task file (JSONL, one task a line), either stoke's task format
    {"id": "...", "prompt": "question text", "answer": "12"}
or a chat line as in the speedrun's `data/sft.jsonl` ({"messages": [user, assistant]}: the question
is the user turn, the answer the number after the assistant reply's last `####`).
`--export-tasks PATH` writes the tasks in stoke's format (so `stoke grpo` can read the very same
file: `[tasks] path = ...`) and exits.

Usage:
    $VENV/bin/python bench/grpo_trl.py --model RUN/model --tasks RUN/data/sft.jsonl \
        --export-tasks $SCRATCH/grpo_tasks.jsonl
    $VENV/bin/python bench/grpo_trl.py --model RUN/model --tasks $SCRATCH/grpo_tasks.jsonl \
        --steps 20 --out $SCRATCH/grpo_trl.json
"""

from __future__ import annotations

import argparse
import json
import resource
import os
import re
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

PROCESS_START = time.perf_counter()

# ---------------------------------------------------------------------------------------------
# The reward: a Python port of stoke_reward's ExactMatchVerifier in gsm8k mode
# (crates/reward/src/exact_match.rs) with the final-answer extractor it falls back on
# (crates/reward/src/math/extract.rs). Reward 1.0 when the prediction equals the gold, else 0.0.
# ---------------------------------------------------------------------------------------------

MAX_ANSWER_BYTES = 2000
MAX_BRACE_DEPTH = 64
# exact_match.rs `number`: optional minus, optional `$`, digits with commas, optional decimals.
GSM8K_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")
# extract.rs `answer_phrase` and `last_number`.
ANSWER_PHRASE = re.compile(r"(?i)(?:final\s+answer|answer)\s*(?:is|:|=)\s*:?")
LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def _balanced_group(text: str, open_index: int) -> str | None:
    depth = 0
    for offset, ch in enumerate(text[open_index:]):
        if ch == "{":
            depth += 1
            if depth > MAX_BRACE_DEPTH:
                return None
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : open_index + offset]
        if offset > MAX_ANSWER_BYTES + 2:
            return None
    return None


def _last_boxed(text: str) -> str | None:
    boxed, fbox = text.rfind("\\boxed"), text.rfind("\\fbox")
    if boxed < 0 and fbox < 0:
        return None
    start, length = (fbox, 5) if fbox > boxed else (boxed, 6)
    rest = text[start + length :]
    trimmed = rest.lstrip()
    if trimmed.startswith("{"):
        return _balanced_group(text, start + length + (len(rest) - len(trimmed)))
    if rest.startswith(" "):
        match = re.match(r"[^$\s]*", trimmed)
        return match.group(0) if match and match.group(0) else None
    return None


def _clean_answer(answer: str) -> str:
    text = answer.strip()
    while True:
        before = text
        for open_, close in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(text) >= len(open_) + len(close) and text.startswith(open_) and text.endswith(close):
                text = text[len(open_) : len(text) - len(close)].strip()
        text = text.rstrip(".。").strip()
        text = (text[1:] if text.startswith(":") else text).strip()
        if text.startswith("\\boxed{") and text.endswith("}"):
            text = text[len("\\boxed{") : -1].strip()
        if text == before:
            return text


def _locate_answer(completion: str) -> str | None:
    """extract.rs `Extractor::locate` followed by `clean_answer`; None like `extract`."""
    found: str | None
    boxed = _last_boxed(completion)
    if boxed is not None:
        found = boxed
    elif (open_index := completion.rfind("<answer>")) >= 0:
        inner = completion[open_index + len("<answer>") :]
        close = inner.find("</answer>")
        inner = inner if close < 0 else inner[:close]
        phrases = list(ANSWER_PHRASE.finditer(inner))
        found = inner[phrases[-1].end() :] if phrases else inner
    elif phrases := list(ANSWER_PHRASE.finditer(completion)):
        rest = completion[phrases[-1].end() :]
        line = next((l for l in rest.split("\n") if l.strip()), "")
        end = line.find(". ")
        found = line if end < 0 else line[:end]
    elif (hashes := completion.rfind("####")) >= 0:
        found = completion[hashes + 4 :].split("\n")[0]
    else:
        numbers = list(LAST_NUMBER.finditer(completion))
        if not numbers:
            return None
        found = numbers[-1].group(0).rstrip(",")
    answer = _clean_answer(found)
    return answer if answer and len(answer.encode()) <= MAX_ANSWER_BYTES else None


def _parse_decimal(text: str) -> Fraction | None:
    """exact_match.rs `parse_decimal`: commas, `$`, spaces and a trailing period ignored."""
    cleaned = "".join(c for c in text.strip().rstrip(".") if c not in ",$ ")
    negative = cleaned.startswith("-")
    digits = cleaned[1:] if negative else cleaned
    whole, _, fraction = digits.partition(".")

    def all_digits(part: str) -> bool:
        return all(c in "0123456789" for c in part)

    if (not whole and not fraction) or not all_digits(whole) or not all_digits(fraction):
        return None
    if len(whole) + len(fraction) > 400:
        return None
    value = Fraction(int(whole + fraction or "0"), 10 ** len(fraction))
    return -value if negative else value


def gsm8k_prediction(completion: str) -> str | None:
    """exact_match.rs `gsm8k_prediction`: after the last `####`, else the final answer, else the last number."""
    hashes = completion.rfind("####")
    if hashes >= 0:
        line = completion[hashes + 4 :].split("\n")[0].removesuffix("\r")
        match = GSM8K_NUMBER.search(line)
        return match.group(0) if match else None
    answer = _locate_answer(completion)
    if answer is not None and (match := GSM8K_NUMBER.search(answer)):
        return match.group(0)
    numbers = list(GSM8K_NUMBER.finditer(completion))
    return numbers[-1].group(0) if numbers else None


def gold_value(gold_raw: str) -> Fraction | None:
    hashes = gold_raw.rfind("####")
    return _parse_decimal(_clean_answer(gold_raw[hashes + 4 :] if hashes >= 0 else gold_raw))


def exact_match_reward(completion: str, gold_raw: str) -> float:
    gold = gold_value(gold_raw)
    if gold is None:
        raise ValueError(f"gold answer {gold_raw!r} is not a number")
    prediction = gsm8k_prediction(completion)
    value = _parse_decimal(prediction) if prediction is not None else None
    return 1.0 if value is not None and value == gold else 0.0


def formatted(completion: str) -> bool:
    """stoke_eval::arithmetic::parse_final_answer is Some: the last line starting with `####` holds one integer."""
    lines = [l for l in completion.split("\n") if l.lstrip().startswith("####")]
    if not lines:
        return False
    return re.fullmatch(r"[+-]?\d+", lines[-1].strip()[4:].strip()) is not None


def _self_test() -> None:
    gold = "Natalia sold 48/2 = 24 clips.\n#### 72"
    cases = [
        ("She sold 72 clips.\n#### 72", 1.0),
        ("total $72.00", 1.0),
        ("#### 1,072", 0.0),
        ("no number", 0.0),
        ("Mia has 7 + 5 = 12 grapes now.\n#### 72", 1.0),
        ("The answer is 72. Then 5", 1.0),
        ("\\boxed{72} and 3", 1.0),
        ("#### 72 then 4 and 5", 1.0),
        ("72 then #### 7", 0.0),
    ]
    for completion, want in cases:
        got = exact_match_reward(completion, gold)
        if got != want:
            raise SystemExit(f"reward self-test failed on {completion!r}: got {got}, want {want}")


# ---------------------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------------------


def load_tasks(path: Path) -> list[dict]:
    tasks = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise SystemExit(f"{path}:{number}: not JSON ({error})")
        if not isinstance(record, dict):
            raise SystemExit(f"{path}:{number}: not a JSON object")
        if "messages" in record:
            messages = record["messages"]
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise SystemExit(f"{path}:{number}: messages must be a list of objects")
            users = [m.get("content") for m in messages if m.get("role") == "user"]
            replies = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
            if not users:
                raise SystemExit(f"{path}:{number}: no user message")
            question = users[0]
            answer = record.get("answer")
            if answer is None and replies and "####" in replies[-1]:
                answer = replies[-1].rsplit("####", 1)[1].strip().splitlines()[0].strip()
        else:
            # stoke's task format ("prompt"), or a problem line as in the speedrun's held_out.jsonl ("question").
            question, answer = record.get("prompt", record.get("question")), record.get("answer")
        if not isinstance(question, str) or answer is None:
            raise SystemExit(f"{path}:{number}: needs a prompt (or user message) and an answer")
        if gold_value(str(answer)) is None:
            raise SystemExit(f"{path}:{number}: answer {answer!r} is not a number")
        tasks.append({"id": record.get("id", f"task-{len(tasks)}"), "question": question, "answer": str(answer)})
    if not tasks:
        raise SystemExit(f"{path}: no tasks")
    return tasks


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="HF model folder (config.json, safetensors, tokenizer)")
    ap.add_argument("--tasks", type=Path, required=True, help="task JSONL (stoke format or chat messages)")
    ap.add_argument("--export-tasks", type=Path, help="write the tasks in stoke's JSONL format and exit")
    ap.add_argument("--out", type=Path, default=Path("grpo_trl.json"), help="JSON result")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn-implementation", default=None, choices=["eager", "sdpa"],
                    help="transformers attention kernel; eager for every figure in bench/GRPO.md "
                    "(transformers' own default is sdpa, not measured on a quiet machine)")
    ap.add_argument("--trl-defaults", action="store_true",
                    help="TRL's own defaults for precision and memory: bf16=True, gradient_checkpointing=True, "
                    "and transformers' default attention (sdpa) unless --attn-implementation is given "
                    "(the issue-19 comparison on SmolLM2-135M)")
    ap.add_argument("--f32", action="store_true",
                    help="with --trl-defaults: keep gradient checkpointing and sdpa but compute in f32. For "
                    "CPUs without AVX512-BF16/AMX, where PyTorch's bf16 matmul falls back to a scalar loop "
                    "(measured 1.1 GFLOP/s against 92 for f32 on an AVX2-only AMD EPYC)")
    ap.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "grpo_trl_run", help="TRL output_dir (nothing is saved)")
    args = ap.parse_args()
    if args.attn_implementation is None:
        args.attn_implementation = "sdpa" if args.trl_defaults else "eager"

    _self_test()
    tasks = load_tasks(args.tasks)
    if args.export_tasks:
        with args.export_tasks.open("w") as out:
            for task in tasks:
                out.write(json.dumps({"id": task["id"], "prompt": task["question"], "answer": task["answer"]}) + "\n")
        print(f"wrote {len(tasks)} tasks to {args.export_tasks}")
        return

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, LlamaForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    imports_seconds = time.perf_counter() - PROCESS_START
    started_load = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = LlamaForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation=args.attn_implementation
    )
    if model.generation_config.eos_token_id is None:
        # A folder without generation_config.json: stop on the model's own end tokens.
        model.generation_config.eos_token_id = model.config.eos_token_id

    # The chat end token must be what generation stops on (TRL stops on tokenizer.eos_token_id plus
    # model.generation_config.eos_token_id and masks the completion after the first of them).
    probe = tokenizer.apply_chat_template(
        [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "#### 2"}], tokenize=False
    )
    if tokenizer.eos_token is None or tokenizer.eos_token not in probe:
        raise SystemExit(f"tokenizer eos {tokenizer.eos_token!r} does not end an assistant turn in the template: {probe!r}")
    special = {
        "eos_token": tokenizer.eos_token,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token": tokenizer.pad_token,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "model_eos_token_id": model.config.eos_token_id,
        "generation_eos_token_id": model.generation_config.eos_token_id,
        "rendered_example": probe,
    }
    print(json.dumps({"special_tokens": special}), file=sys.stderr)

    generation_eos = model.generation_config.eos_token_id
    stop_ids = {tokenizer.eos_token_id, *(generation_eos if isinstance(generation_eos, list) else [generation_eos])}
    stop_ids.discard(None)

    needed = args.steps * args.prompts_per_step
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": t["question"]}], "answer": t["answer"]} for t in tasks]
    )
    if len(dataset) < needed:
        print(f"note: {len(dataset)} tasks for {needed} prompts; TRL will start another epoch", file=sys.stderr)

    # Per generation batch: completion tokens, reward mean, correct / formatted fractions.
    batches: list[dict] = []

    def exact_match(prompts, completions, completion_ids, answer, **_kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rewards = [exact_match_reward(text, gold) for text, gold in zip(texts, answer, strict=True)]
        lengths = [len(ids) for ids in completion_ids]
        eos = set(stop_ids)
        batches.append(
            {
                "samples": len(texts),
                "completion_tokens": sum(lengths),
                "length_max": max(lengths),
                "ended_with_eos": sum(1 for ids in completion_ids if ids and ids[-1] in eos) / len(texts),
                "reward_mean": sum(rewards) / len(rewards),
                "formatted_fraction": sum(formatted(t) for t in texts) / len(texts),
                "example": texts[0],
            }
        )
        return rewards

    timings = {"generate": [], "generate_and_score": []}

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with wall-clock timers around generation and the whole rollout phase."""

        def _generate_single_turn(self, *a, **kw):
            t0 = time.perf_counter()
            try:
                return super()._generate_single_turn(*a, **kw)
            finally:
                timings["generate"].append(time.perf_counter() - t0)

        def _generate_and_score_completions(self, *a, **kw):
            t0 = time.perf_counter()
            try:
                return super()._generate_and_score_completions(*a, **kw)
            finally:
                timings["generate_and_score"].append(time.perf_counter() - t0)

    step_seconds: list[float] = []
    log_records: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, _args, _state, _control, **_kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, _args, _state, _control, **_kw):
            step_seconds.append(time.perf_counter() - self.t0)

        def on_log(self, _args, state, _control, logs=None, **_kw):
            if logs:
                log_records.append({**logs, "step": state.global_step})

    config = GRPOConfig(
        output_dir=str(args.work_dir),
        use_cpu=True,
        bf16=args.trl_defaults and not args.f32,
        fp16=False,
        gradient_checkpointing=args.trl_defaults,
        seed=args.seed,
        data_seed=args.seed,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        per_device_train_batch_size=args.prompts_per_step * args.group_size,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="dapo",
        num_iterations=1,
        epsilon=0.2,
        scale_rewards="group",
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=exact_match,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    load_seconds = time.perf_counter() - started_load
    load_average_start = os.getloadavg()
    cpu_start = time.process_time()
    t0 = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - t0
    cpu_seconds = time.process_time() - cpu_start
    load_average_end = os.getloadavg()

    steps = len(step_seconds)
    samples = sum(b["samples"] for b in batches)
    tokens = sum(b["completion_tokens"] for b in batches)
    step_total = sum(step_seconds)
    generate_total = sum(timings["generate"])
    rollout_total = sum(timings["generate_and_score"])
    per_step = []
    for i in range(steps):
        b = batches[i] if i < len(batches) else {}
        log = next((l for l in log_records if l.get("step") == i + 1 and "loss" in l), {})
        per_step.append(
            {
                "step": i + 1,
                "seconds": step_seconds[i],
                "generate_seconds": timings["generate"][i] if i < len(timings["generate"]) else None,
                "rollout_seconds": timings["generate_and_score"][i] if i < len(timings["generate_and_score"]) else None,
                "samples": b.get("samples"),
                "completion_tokens": b.get("completion_tokens"),
                "length_mean": b["completion_tokens"] / b["samples"] if b else None,
                "length_max": b.get("length_max"),
                "ended_with_eos": b.get("ended_with_eos"),
                "reward_mean": b.get("reward_mean"),
                "formatted_fraction": b.get("formatted_fraction"),
                "loss": log.get("loss"),
                "grad_norm": log.get("grad_norm"),
                "trl_reward": log.get("reward"),
                "example_completion": b.get("example"),
            }
        )
    sorted_steps = sorted(step_seconds)
    result = {
        "tool": "trl.GRPOTrainer",
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "model": str(args.model),
        "tasks": str(args.tasks),
        "task_count": len(tasks),
        "parameters": sum(p.numel() for p in model.parameters()),
        "settings": {
            "steps": args.steps,
            "group_size": args.group_size,
            "prompts_per_step": args.prompts_per_step,
            "samples_per_step": args.group_size * args.prompts_per_step,
            "max_completion_length": args.max_completion_length,
            "temperature": args.temperature,
            "lr": args.lr,
            "beta": 0.0,
            "loss_type": "dapo",
            "threads": args.threads,
            "seed": args.seed,
            "attn_implementation": args.attn_implementation,
        },
        "special_tokens": special,
        "imports_seconds": imports_seconds,
        "load_seconds": load_seconds,
        "train_seconds": train_seconds,
        "cpu_per_wall": cpu_seconds / train_seconds,
        "load_average_start": load_average_start,
        "load_average_end": load_average_end,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "trl_defaults": args.trl_defaults,
        "steps_done": steps,
        "seconds_per_step_mean": step_total / steps,
        "seconds_per_step_median": sorted_steps[steps // 2],
        "samples_per_second": samples / train_seconds,
        "completion_tokens_per_second": tokens / train_seconds,
        "samples": samples,
        "completion_tokens": tokens,
        "generate_share_of_step_time": generate_total / step_total,
        "rollout_share_of_step_time": rollout_total / step_total,
        "generate_seconds": generate_total,
        "rollout_seconds": rollout_total,
        "update_seconds": step_total - rollout_total,
        "reward_first_step": per_step[0]["reward_mean"],
        "reward_last_step": per_step[-1]["reward_mean"],
        "per_step": per_step,
    }
    # Everything from the script's first line: imports (torch, transformers, trl), model and
    # trainer setup, train(); Python's own start-up (~0.05 s) is not included.
    result["process_seconds"] = time.perf_counter() - PROCESS_START
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    print(f"TRL {trl.__version__} GRPOTrainer, {steps} steps x {args.prompts_per_step} prompts x {args.group_size} samples")
    print(f"train() {train_seconds:.1f} s  ({result['seconds_per_step_mean']:.2f} s/step mean, "
          f"{result['seconds_per_step_median']:.2f} median)  cpu/wall {result['cpu_per_wall']:.2f}")
    print(f"process {result['process_seconds']:.1f} s (imports {imports_seconds:.1f} s, model + trainer setup {load_seconds:.1f} s)")
    print(f"samples/s {result['samples_per_second']:.2f}  completion tokens/s {result['completion_tokens_per_second']:.1f}  "
          f"generation {100 * result['generate_share_of_step_time']:.0f}% of step time "
          f"(generation + reward {100 * result['rollout_share_of_step_time']:.0f}%)")
    print("| step | s | generate s | tokens | mean len | reward | formatted | loss |")
    print("|---|---|---|---|---|---|---|---|")
    for s in per_step:
        print(f"| {s['step']} | {s['seconds']:.2f} | {s['generate_seconds'] or 0:.2f} | {s['completion_tokens']} | "
              f"{s['length_mean'] or 0:.1f} | {s['reward_mean'] or 0:.3f} | {s['formatted_fraction'] or 0:.2f} | "
              f"{s['loss'] if s['loss'] is not None else 'n/a'} |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
