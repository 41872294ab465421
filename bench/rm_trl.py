#!/usr/bin/env python3
"""Reward-model reference: TRL's RewardTrainer on a Hugging Face model and a preference-pair JSONL,
timed per step, and optionally held-out pair accuracy.

What it is: the TRL half of the "stoke rm vs TRL RewardTrainer" benchmark (issue 52). It loads a
causal-LM folder (e.g. SmolLM2-135M-Instruct at $SCRATCH/smollm2/hf) as
`AutoModelForSequenceClassification(num_labels=1)` (what `stoke rm` makes of it), reads pairs in
TRL's conversational preference format (bench/make_pairs.py writes them), runs
`RewardTrainer.train()` on the CPU for a fixed number of optimizer steps and prints ONE JSON line
on stdout: the wall-clock seconds of every step (a TrainerCallback around on_step_begin /
on_step_end), the median and mean of steps 2..N (step 1 warms up), peak RSS, the final logged
metrics and, with --eval, the held-out pair accuracy of the trained model. Everything else goes
to stderr.

Peers at their defaults: RewardConfig's defaults are bf16 (TRL's default when --f32 is not given)
and gradient checkpointing on (transformers' TrainingArguments default that TRL 1.x sets); the
JSON records both. stoke's half is bench/rm-smollm2.toml (f32 master weights; bf16 products with
training.precision = "bf16").

What it is not: part of CI (it needs the venv with torch / transformers / trl).

Pinned versions it was written against: torch 2.15.0, transformers 5.25.0, trl 1.16.0.

Usage:
    python3 bench/make_pairs.py --out $SCRATCH/rm/pairs.jsonl --n 512 --seed 0
    python3 bench/make_pairs.py --out $SCRATCH/rm/heldout.jsonl --n 200 --seed 1
    $VENV/bin/python bench/rm_trl.py --data $SCRATCH/rm/pairs.jsonl --steps 8 --batch 8 > $SCRATCH/rm/trl.json
    stoke rm bench/rm-smollm2.toml
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROCESS_START = time.perf_counter()


def load_pairs(path: Path) -> list[dict]:
    pairs = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise SystemExit(f"{path}:{number}: not JSON ({error})")
        if not all(key in record for key in ("prompt", "chosen", "rejected")):
            raise SystemExit(f"{path}:{number}: needs prompt, chosen and rejected")
        pairs.append({key: record[key] for key in ("prompt", "chosen", "rejected")})
    if not pairs:
        raise SystemExit(f"{path}: no pairs")
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path(os.environ.get("SCRATCH", "scratch")) / "smollm2" / "hf")
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--eval", type=Path, help="held-out pairs: report pair accuracy after training")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8, help="pairs per optimizer step")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--f32", action="store_true", help="bf16=False (TRL's default is bf16)")
    ap.add_argument("--no-grad-ckpt", action="store_true", help="gradient_checkpointing=False (default on)")
    ap.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "rm_trl_run")
    args = ap.parse_args()
    pairs = load_pairs(args.data)
    held_out = load_pairs(args.eval) if args.eval else None
    stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        result = run(args, pairs, held_out)
    print(json.dumps(result), file=stdout, flush=True)


def run(args, pairs, held_out) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl import RewardConfig, RewardTrainer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=1, dtype=torch.float32)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id

    step_seconds: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, _args, _state, _control, **_kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, _args, _state, _control, **_kw):
            step_seconds.append(time.perf_counter() - self.t0)

    config = RewardConfig(
        output_dir=str(args.work_dir),
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1,
        max_steps=args.steps,
        learning_rate=args.lr,
        max_length=args.max_length,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
        bf16=not args.f32,
        gradient_checkpointing=not args.no_grad_ckpt,
        disable_tqdm=True,
    )
    trainer = RewardTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(pairs),
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    t0 = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - t0
    history = [e for e in trainer.state.log_history if "loss" in e and "step" in e]
    after_warmup = step_seconds[1:] or step_seconds

    accuracy = None
    if held_out:
        model.eval()
        right = 0
        with torch.no_grad():
            for pair in held_out:
                scores = []
                for key in ("chosen", "rejected"):
                    text = tokenizer.apply_chat_template(pair["prompt"] + pair[key], tokenize=False)
                    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
                    scores.append(model(**ids).logits[0, 0].item())
                right += scores[0] > scores[1]
        accuracy = right / len(held_out)

    return {
        "tool": "trl.RewardTrainer",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
        "settings": {
            "steps": args.steps, "batch_pairs": args.batch, "max_length": args.max_length, "lr": args.lr,
            "threads": args.threads, "bf16": config.bf16, "gradient_checkpointing": config.gradient_checkpointing,
            "center_rewards_coefficient": config.center_rewards_coefficient,
        },
        "step_seconds": step_seconds,
        "step_seconds_median_2_n": statistics.median(after_warmup),
        "step_seconds_mean_2_n": statistics.fmean(after_warmup),
        "train_seconds": train_seconds,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "final_metrics": {k: history[-1].get(k) for k in ("loss", "accuracy", "margin", "mean_reward")} if history else {},
        "held_out_pairs": len(held_out) if held_out else 0,
        "held_out_accuracy": accuracy,
        "total_wall_seconds": time.perf_counter() - PROCESS_START,
    }


if __name__ == "__main__":
    main()
