#!/usr/bin/env python3
"""Loss oracle for stoke's GRPO math: runs TRL's own `GRPOTrainer._compute_loss` on fixed random
per-token log-probs and writes the losses, gradients and metrics to fixtures/grpo/trl_loss.json.

This installs nothing. Run by hand, once, with a Python that has TRL (pinned below) and torch:

    $VENV/bin/pip install --no-deps trl==1.16.0 && $VENV/bin/pip install accelerate datasets pandas
    $VENV/bin/python scripts/make_grpo_fixtures.py

How the real TRL code is driven (no re-implementation of the loss here):
- the trainer object is made with `GRPOTrainer.__new__(GRPOTrainer)`, skipping `__init__` (which
  would load a model and a dataset), and only the attributes `_compute_loss` reads are set:
  loss_type, importance_sampling_level, epsilon_low/high, beta, max_completion_length,
  current_gradient_accumulation_steps, top_entropy_quantile, off_policy_mask_threshold, use_vllm,
  aux_loss_enabled, _entropy_bonus_enabled, _metrics, a real single-process `accelerate.Accelerator`,
  `args` (use_bias_correction_kl, delta, steps_per_generation) and a `model` in train mode;
- the method that would run the model, `_get_per_token_logps_and_entropies`, is replaced on the
  instance by one returning the fixed current log-probs (a float64 leaf with requires_grad), so the
  loss, its gradient w.r.t. those log-probs, and TRL's logged metrics come from TRL's code path;
- `inputs` carries old and reference log-probs, advantages, the completion mask and, for dapo/cispo,
  `num_items_in_batch` = the mask's token count (one process, one micro-batch, so TRL's dapo
  normaliser is the token count and dapo equals token-mean).
"""

import json
import sys
import types
from collections import defaultdict
from pathlib import Path

import torch
import trl
from accelerate import Accelerator
from trl.trainer.grpo_trainer import GRPOTrainer

TRL_VERSION = "1.16.0"
B, T = 4, 6
MAX_COMPLETION_LENGTH = 8

# (name, loss_type, importance_sampling_level, epsilon_low, epsilon_high, beta)
CASES = [
    ("grpo_token", "grpo", "token", 0.2, 0.2, 0.0),
    ("grpo_token_kl_cliphigher", "grpo", "token", 0.2, 0.28, 0.04),
    ("bnpo_token", "bnpo", "token", 0.2, 0.2, 0.0),
    ("dapo_token_cliphigher", "dapo", "token", 0.2, 0.28, 0.0),
    ("dapo_token_kl", "dapo", "token", 0.2, 0.28, 0.04),
    ("dr_grpo_token", "dr_grpo", "token", 0.2, 0.2, 0.0),
    ("dr_grpo_sequence_kl", "dr_grpo", "sequence", 0.1, 0.15, 0.1),
    ("grpo_sequence", "grpo", "sequence", 0.05, 0.08, 0.0),
    ("dapo_sequence_kl", "dapo", "sequence", 0.05, 0.08, 0.04),
    ("cispo_token", "cispo", "token", 0.2, 1.2, 0.0),
    # GSPO paper's epsilons: most sequences clip, both ways.
    ("gspo_paper_epsilons", "dapo", "sequence", 3e-4, 4e-4, 0.0),
]


def make_inputs():
    gen = torch.Generator().manual_seed(20261130)
    current = -3.0 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    old = current + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    ref = current + 0.5 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    advantages = torch.tensor([1.3, -0.7, 0.4, -1.1], dtype=torch.float64)
    lengths = [6, 3, 5, 1]
    mask = torch.zeros(B, T, dtype=torch.float64)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1.0
    return current, old, ref, advantages, mask


def make_trainer(loss_type, level, eps_low, eps_high, beta, current):
    trainer = GRPOTrainer.__new__(GRPOTrainer)
    trainer.loss_type = loss_type
    trainer.importance_sampling_level = level
    trainer.epsilon_low = eps_low
    trainer.epsilon_high = eps_high
    trainer.beta = beta
    trainer.max_completion_length = MAX_COMPLETION_LENGTH
    trainer.current_gradient_accumulation_steps = 1
    trainer.top_entropy_quantile = 1.0
    trainer.off_policy_mask_threshold = None
    trainer.use_vllm = False
    trainer.aux_loss_enabled = False
    trainer._entropy_bonus_enabled = False
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer.accelerator = Accelerator(cpu=True)
    trainer.args = types.SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1)
    trainer.model = torch.nn.Linear(1, 1).train()

    def fixed_logps(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
        return current, torch.zeros_like(current), None

    trainer._get_per_token_logps_and_entropies = types.MethodType(fixed_logps, trainer)
    return trainer


def run_case(name, loss_type, level, eps_low, eps_high, beta, data):
    current0, old, ref, advantages, mask = data
    current = current0.clone().requires_grad_(True)
    trainer = make_trainer(loss_type, level, eps_low, eps_high, beta, current)
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    if beta != 0.0:
        inputs["ref_per_token_logps"] = ref
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    metrics = {key: values[-1] for key, values in trainer._metrics["train"].items()}
    return {
        "name": name,
        "loss_type": loss_type,
        "importance_sampling_level": level,
        "epsilon_low": eps_low,
        "epsilon_high": eps_high,
        "beta": beta,
        "loss": loss.item(),
        "grad_current_logprobs": current.grad.tolist(),
        "clip_low": metrics.get("clip_ratio/low_mean"),
        "clip_high": metrics.get("clip_ratio/high_mean", metrics.get("cispo_clip_ratio")),
        "clip_region": metrics.get("clip_ratio/region_mean"),
        "kl": metrics.get("kl"),
    }


def main():
    if trl.__version__ != TRL_VERSION:
        sys.exit(f"expected trl {TRL_VERSION}, found {trl.__version__}")
    data = make_inputs()
    current, old, ref, advantages, mask = data
    out = {
        "generator": "scripts/make_grpo_fixtures.py",
        "trl_version": trl.__version__,
        "torch_version": torch.__version__,
        "max_completion_length": MAX_COMPLETION_LENGTH,
        "current_logprobs": current.tolist(),
        "old_logprobs": old.tolist(),
        "ref_logprobs": ref.tolist(),
        "advantages": advantages.tolist(),
        "mask": mask.tolist(),
        "cases": [run_case(*case, data) for case in CASES],
    }
    path = Path(__file__).resolve().parent.parent / "fixtures" / "grpo" / "trl_loss.json"
    # One line per top-level key and per case: small, and diffs stay readable.
    lines = [f" {json.dumps(key)}: {json.dumps(value)}" for key, value in out.items() if key != "cases"]
    cases = ",\n".join(f"  {json.dumps(case)}" for case in out["cases"])
    path.write_text("{\n" + ",\n".join(lines) + ',\n "cases": [\n' + cases + "\n ]\n}\n")
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(out['cases'])} cases)")


if __name__ == "__main__":
    main()
