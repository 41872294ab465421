#!/usr/bin/env python3
"""Logit-distillation reference: TRL's GKDTrainer (supervised regime, lmbda = 0) on a Hugging Face
student and teacher and a chat JSONL, timed per step.

What it is: the TRL half of the "stoke train [distill] vs TRL GKDTrainer" benchmark (issue 17).
It loads the student and the teacher (model folders in Hugging Face layout, e.g. SmolLM2-135M-Instruct
at $SCRATCH/smollm2/hf for both) with transformers in f32, reads chat records ({"messages": [...]}),
runs `GKDTrainer.train()` on the CPU for a fixed number of optimizer steps with lmbda = 0 (every
batch is the data's own completions: no generation, GKD's supervised KD) and prints ONE JSON line on
stdout: every step's wall seconds (a TrainerCallback around on_step_begin / on_step_end), the median
and mean of steps 2..N, the time before step 1, total wall time, peak RSS and the last logged
metrics. The loss is TRL's generalized_jsd_loss with beta 0.5 (GKDConfig's default) at temperature
1 (compute_loss passes none; GKDConfig.temperature is the generation temperature).

With --lmbda 1 every batch is on-policy (GKD's on-policy regime, the reference for `stoke grpo`
with [grpo.loss.distill]): the student generates --max-new-tokens at --temperature for the
batch's prompts and the loss is taken on its own tokens; TRL's default lmbda is 0.5 (a coin flip
per step).

What it is not: part of CI (it needs the venv with torch / transformers / trl).

Pinned versions: torch 2.15.0, transformers 5.24.0, trl 1.16.0 ($VENV).

Settings (stoke name -> TRL name): sequences per step -> per_device_train_batch_size (--batch),
gradient_accumulation_steps 1; steps -> max_steps; seq_len -> max_length (--max-length); beta ->
beta; lr -> learning_rate; activation checkpointing -> gradient_checkpointing (TRL's default True;
--no-grad-ckpt turns it off); dropout off; the rest TRL / transformers defaults.

    $VENV/bin/python bench/gkd_trl.py --data $SCRATCH/gkd/chat.jsonl --steps 8 --batch 4
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--student", type=Path, default=Path(os.environ.get("SCRATCH", "scratch")) / "smollm2" / "hf")
    ap.add_argument("--teacher", type=Path, default=Path(os.environ.get("SCRATCH", "scratch")) / "smollm2" / "hf")
    ap.add_argument("--data", type=Path, required=True, help="chat JSONL, one {messages: [...]} per line")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lmbda", type=float, default=0.0, help="fraction of on-policy (student-generated) batches")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="GKDConfig.max_new_tokens (on-policy batches)")
    ap.add_argument("--temperature", type=float, default=0.9, help="GKDConfig.temperature (generation)")
    ap.add_argument("--no-grad-ckpt", action="store_true", help="gradient checkpointing off (TRL's default: on)")
    ap.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "gkd_trl_run")
    args = ap.parse_args()
    records = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        result = run(args, records)
    print(json.dumps(result), file=stdout, flush=True)


def run(args: argparse.Namespace, records: list[dict]) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.student)
    student = AutoModelForCausalLM.from_pretrained(args.student, dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(args.teacher, dtype=torch.float32)

    step_seconds: list[float] = []
    marks: dict[str, float] = {}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, _args, _state, _control, **_kw):
            self.t0 = time.perf_counter()
            marks.setdefault("first_step_begin", self.t0)

        def on_step_end(self, _args, _state, _control, **_kw):
            step_seconds.append(time.perf_counter() - self.t0)

    config = GKDConfig(
        output_dir=str(args.work_dir),
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1,
        max_steps=args.steps,
        learning_rate=args.lr,
        beta=args.beta,
        lmbda=args.lmbda,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seq_kd=False,
        max_length=args.max_length,
        gradient_checkpointing=not args.no_grad_ckpt,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        bf16=False,
        use_cpu=True,
        disable_dropout=True,
        dataloader_num_workers=0,
    )
    trainer = GKDTrainer(
        model=student,
        teacher_model=teacher,
        args=config,
        train_dataset=Dataset.from_list(records),
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    trainer.train()
    timed = step_seconds[1:] or step_seconds
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {
        "tool": "trl GKDTrainer",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
        "steps": len(step_seconds),
        "step_seconds": step_seconds,
        "median_step_seconds_2_on": statistics.median(timed),
        "mean_step_seconds_2_on": statistics.fmean(timed),
        "before_first_step_seconds": marks.get("first_step_begin", PROCESS_START) - PROCESS_START,
        "total_seconds": time.perf_counter() - PROCESS_START,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "gradient_checkpointing": config.gradient_checkpointing,
        "lmbda": config.lmbda,
        "last_log": logs[-1] if logs else None,
    }


if __name__ == "__main__":
    main()
