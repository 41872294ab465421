#!/usr/bin/env python3
"""DPO reference: TRL's DPOTrainer on a Hugging Face model and a preference-pair JSONL, timed per step.

What it is: the TRL half of the "stoke dpo vs TRL DPOTrainer" benchmark. It loads a model folder
(Hugging Face layout with tokenizer files and chat template, e.g. SmolLM2-135M-Instruct at
$SCRATCH/smollm2/hf) with transformers in f32, reads pairs in TRL's conversational preference format
(bench/make_pairs.py writes them), runs `DPOTrainer.train()` on the CPU for a fixed number of
optimizer steps and prints ONE JSON line on stdout: the wall-clock seconds of every step (a
TrainerCallback around on_step_begin / on_step_end), median and mean of steps 2..N (step 1 warms
up), the time before step 1 (dataset tokenization, the reference model copy or the reference
log-prob precompute, optimizer setup), total wall time, peak RSS, token counts of the data and the
final logged TRL metrics. Everything else (transformers / TRL logging, the per-step log dicts the
Trainer prints) goes to stderr.

What it is not: part of CI (it needs the venv with torch / transformers / trl), or a tuned TRL
setup: f32 unless --bf16, no gradient checkpointing unless --grad-ckpt (TRL 1.x turns it on by
default; this script passes it explicitly), no Liger kernels, no packing.

Pinned versions it was written against: Python 3, torch 2.15.0, transformers 5.24.0, trl 1.16.0,
datasets and accelerate from the same venv ($VENV).

Settings (stoke name -> TRL name):
  pairs per step        -> per_device_train_batch_size (--batch), gradient_accumulation_steps 1
  steps                 -> max_steps (--steps)
  beta, loss            -> beta (--beta), loss_type [--loss-type] (sigmoid = standard DPO)
  max_length            -> max_length (--max-length): per sequence, prompt + completion, truncated
                           keep_start (the completion end is cut); pairs whose prompt alone fills
                           max_length are dropped by TRL before training
  reference cache       -> precompute_ref_log_probs (--precompute-ref): reference log-probs for the
                           whole data set are computed in DPOTrainer.__init__ with the policy
                           before any update and no reference copy is kept; without it TRL loads
                           a second copy of the model (ref_model=None) and runs it every step
  dropout off           -> disable_dropout True
  the rest              -> TRL / transformers defaults (AdamW, weight decay 0, max_grad_norm 1.0,
                           linear lr decay to 0 over max_steps, no warmup); the JSON records them

The pairs file is read with json and handed to TRL as an in-memory `datasets.Dataset`. That matters
for --precompute-ref: TRL caches the precomputed reference log-probs in an Arrow file keyed by the
data set fingerprint and the model hash; for a data set loaded with `load_dataset("json", ...)` that
file sits in the HF datasets cache and a second run reuses it (no precompute time), while for an
in-memory data set it goes to a temporary folder removed at exit, so every run pays the precompute.

Usage:
    python3 bench/make_pairs.py --out $SCRATCH/dpo_pairs.jsonl --n 256 --seed 0
    $VENV/bin/python bench/dpo_trl.py --data $SCRATCH/dpo_pairs.jsonl --steps 8 --batch 4 > $SCRATCH/dpo_trl.json
    $VENV/bin/python bench/dpo_trl.py --data $SCRATCH/dpo_pairs.jsonl --precompute-ref > $SCRATCH/dpo_trl_pre.json
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

FINAL_KEYS = ["loss", "rewards/margins", "rewards/accuracies", "rewards/chosen", "rewards/rejected",
              "logps/chosen", "logps/rejected", "grad_norm", "learning_rate"]


def load_pairs(path: Path) -> list[dict]:
    """Preference pairs, conversational (prompt = [user message(s)], chosen / rejected = [assistant
    message]) or standard (three non-empty strings)."""
    pairs = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise SystemExit(f"{path}:{number}: not JSON ({error})")
        for key in ("prompt", "chosen", "rejected"):
            messages = record.get(key) if isinstance(record, dict) else None
            if isinstance(messages, str) and messages:
                continue  # TRL's standard (plain text) format, as the speedrun's pairs
            if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            ):
                raise SystemExit(
                    f"{path}:{number}: {key!r} must be a non-empty string or list of {{role, content}} messages"
                )
        pairs.append({key: record[key] for key in ("prompt", "chosen", "rejected")})
    if not pairs:
        raise SystemExit(f"{path}: no pairs")
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path(os.environ.get("SCRATCH", "scratch")) / "smollm2" / "hf",
                    help="HF model folder (config.json, safetensors, tokenizer, chat template)")
    ap.add_argument("--data", type=Path, required=True, help="preference pairs JSONL (bench/make_pairs.py)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4, help="pairs per optimizer step (per_device_train_batch_size)")
    ap.add_argument("--max-length", type=int, default=256, help="tokens per sequence, prompt + completion")
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--loss-type", default="sigmoid")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--precompute-ref", action="store_true",
                    help="precompute_ref_log_probs=True: reference log-probs before training, no reference copy")
    ap.add_argument("--bf16", action="store_true", help="bf16 mixed precision (default: f32)")
    ap.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing (default: off)")
    ap.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "dpo_trl_run", help="TRL output_dir (nothing is saved)")
    args = ap.parse_args()
    if args.steps < 1 or args.batch < 1:
        raise SystemExit("--steps and --batch must be at least 1")

    pairs = load_pairs(args.data)
    stdout = sys.stdout
    # The Trainer prints its log dicts (and tqdm writes) to stdout; keep stdout for the one JSON line.
    with contextlib.redirect_stdout(sys.stderr):
        result = run(args, pairs)
    print(json.dumps(result), file=stdout, flush=True)
    if not result["log_history_ok"]:
        raise SystemExit(f"TRL log_history has steps {result['logged_steps']}, expected 1..{args.steps}")


def run(args: argparse.Namespace, pairs: list[dict]) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    torch.set_num_threads(args.threads)
    imports_seconds = time.perf_counter() - PROCESS_START

    started_load = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    load_seconds = time.perf_counter() - started_load

    # With ref_model=None and no precompute, TRL loads its reference copy with create_model_from_path, which
    # reads `architectures` from the folder's config.json and fails (TypeError: 'NoneType' object is not
    # subscriptable) when it is null, as in $SCRATCH/smollm2/hf. Then hand it the class TRL itself falls back on
    # for remote-code models; the copy is otherwise TRL's own (same dtype, attention kernel, device).
    architecture_patched = not args.precompute_ref and not getattr(model.config, "architectures", None)
    if architecture_patched:
        import functools

        import trl.trainer.dpo_trainer as dpo_module

        dpo_module.create_model_from_path = functools.partial(
            dpo_module.create_model_from_path, architecture=AutoModelForCausalLM
        )
        print("note: config.json has no architectures; TRL's reference copy uses AutoModelForCausalLM", file=sys.stderr)

    timings: dict[str, float] = {"prepare_dataset": 0.0, "precompute_ref": 0.0}

    class TimedDPOTrainer(DPOTrainer):
        """DPOTrainer with wall-clock timers around tokenization and the reference precompute (both in __init__)."""

        def _prepare_dataset(self, *a, **kw):
            t0 = time.perf_counter()
            try:
                return super()._prepare_dataset(*a, **kw)
            finally:
                timings["prepare_dataset"] += time.perf_counter() - t0

        def _precompute_ref_logps(self, *a, **kw):
            t0 = time.perf_counter()
            try:
                return super()._precompute_ref_logps(*a, **kw)
            finally:
                timings["precompute_ref"] += time.perf_counter() - t0

    step_seconds: list[float] = []
    marks: dict[str, float] = {}

    class StepTimer(TrainerCallback):
        def on_train_begin(self, _args, _state, _control, **_kw):
            marks.setdefault("train_begin", time.perf_counter())

        def on_step_begin(self, _args, _state, _control, **_kw):
            self.t0 = time.perf_counter()
            marks.setdefault("first_step_begin", self.t0)

        def on_step_end(self, _args, _state, _control, **_kw):
            step_seconds.append(time.perf_counter() - self.t0)

    config = DPOConfig(
        output_dir=str(args.work_dir),
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1,
        max_steps=args.steps,
        learning_rate=args.lr,
        beta=args.beta,
        loss_type=[args.loss_type],
        max_length=args.max_length,
        precompute_ref_log_probs=args.precompute_ref,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
        bf16=args.bf16,  # TRL's own default (None) means bf16 on
        fp16=False,
        gradient_checkpointing=args.grad_ckpt,  # TRL's own default is True
        disable_dropout=True,
        disable_tqdm=True,
    )
    dataset = Dataset.from_list(pairs)
    started_setup = time.perf_counter()
    trainer = TimedDPOTrainer(
        model=model,
        ref_model=None,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    init_seconds = time.perf_counter() - started_setup

    train_data = trainer.train_dataset
    prompt_lens = [len(ids) for ids in train_data["prompt_ids"]]
    chosen_lens = [len(ids) for ids in train_data["chosen_ids"]]
    rejected_lens = [len(ids) for ids in train_data["rejected_ids"]]
    seq_lens = [p + c for p, c in zip(prompt_lens, chosen_lens)] + [p + r for p, r in zip(prompt_lens, rejected_lens)]
    first = train_data[0]
    rendered_chosen = tokenizer.decode(first["prompt_ids"] + first["chosen_ids"])
    print(json.dumps({"rendered_first_chosen": rendered_chosen}), file=sys.stderr)

    cpu_start = time.process_time()
    load_average_start = os.getloadavg()
    t0 = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - t0
    cpu_seconds = time.process_time() - cpu_start
    load_average_end = os.getloadavg()

    history = trainer.state.log_history
    step_logs = [entry for entry in history if "loss" in entry and "step" in entry]
    logged_steps = [entry["step"] for entry in step_logs]
    log_history_ok = logged_steps == list(range(1, args.steps + 1)) and len(step_seconds) == args.steps
    final = step_logs[-1] if step_logs else {}
    after_warmup = step_seconds[1:] or step_seconds
    before_first_step = marks.get("first_step_begin", time.perf_counter()) - started_setup
    ref_in_memory = trainer.ref_model is not None

    return {
        "tool": "trl.DPOTrainer",
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "model": str(args.model),
        "data": str(args.data),
        "pairs_in_file": len(pairs),
        "pairs_after_filter": len(train_data),
        "pairs_seen": args.steps * args.batch,  # more than pairs_after_filter: TRL starts another epoch
        "parameters": sum(p.numel() for p in model.parameters()),
        "settings": {
            "steps": args.steps,
            "batch_pairs": args.batch,
            "max_length": args.max_length,
            "beta": args.beta,
            "lr": args.lr,
            "loss_type": args.loss_type,
            "threads": args.threads,
            "precompute_ref_log_probs": args.precompute_ref,
            "bf16": args.bf16,
            "gradient_checkpointing": args.grad_ckpt,
            "attn_implementation": model.config._attn_implementation,
            "optim": str(config.optim),
            "lr_scheduler_type": str(config.lr_scheduler_type),
            "warmup_steps": config.warmup_steps,
            "weight_decay": config.weight_decay,
            "max_grad_norm": config.max_grad_norm,
            "truncation_mode": config.truncation_mode,
            "reference_model_in_memory": ref_in_memory,
            "reference_architecture_patched": architecture_patched,
        },
        "tokens": {
            "prompt_mean": statistics.fmean(prompt_lens),
            "chosen_mean": statistics.fmean(chosen_lens),
            "rejected_mean": statistics.fmean(rejected_lens),
            "sequence_max": max(seq_lens),
            "sequences_truncated": sum(n > args.max_length for n in seq_lens),
        },
        "step_seconds": step_seconds,
        "step_seconds_median_2_n": statistics.median(after_warmup),
        "step_seconds_mean_2_n": statistics.fmean(after_warmup),
        "pairs_per_second_2_n": args.batch / statistics.fmean(after_warmup),
        # From DPOTrainer(...) to the first on_step_begin: tokenization, reference copy or precompute, and
        # train()'s own setup (accelerate prepare, optimizer); imports and model load are separate.
        "seconds_before_step_1": before_first_step,
        "seconds_tokenize": timings["prepare_dataset"],
        "seconds_precompute_ref": timings["precompute_ref"],
        "seconds_trainer_init": init_seconds,
        "seconds_train_to_step_1": marks.get("first_step_begin", t0) - t0,
        "imports_seconds": imports_seconds,
        "load_seconds": load_seconds,
        "train_seconds": train_seconds,
        "cpu_per_wall": cpu_seconds / train_seconds,
        "load_average_start": load_average_start,
        "load_average_end": load_average_end,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "final_metrics": {key: final.get(key) for key in FINAL_KEYS},
        "per_step": [
            {"step": e["step"], "loss": e.get("loss"), "rewards/margins": e.get("rewards/margins"),
             "rewards/accuracies": e.get("rewards/accuracies")}
            for e in step_logs
        ],
        "logged_steps": logged_steps,
        "log_history_ok": log_history_ok,
        # Everything from the script's first line (Python's own start-up, ~0.05 s, not included).
        "total_wall_seconds": time.perf_counter() - PROCESS_START,
    }


if __name__ == "__main__":
    main()
