#!/usr/bin/env python3
"""Oracle for stoke's reward models (`stoke rm`): a tiny random `LlamaForSequenceClassification`
that transformers builds and saves, the scores transformers gives it, and TRL's `RewardTrainer`
loss, metrics and gradients on fixed preference pairs.

This installs nothing. Run by hand, once, with a Python that has the pinned packages
(trl==1.16.0, transformers==5.25.0, torch==2.15.0, accelerate):

    $VENV/bin/python scripts/make_reward_model_fixtures.py

Everything is seeded, so a rerun rewrites the same bytes. Writes:

- `fixtures/models/llama_reward_model/`: config.json + model.safetensors (f32) of
  `LlamaForSequenceClassification(num_labels=1, pad_token_id=0)`, vocab 64, hidden 32, 2 layers,
  4 heads (2 KV heads), weights from `torch.manual_seed(0)` at `initializer_range = 0.2` (large
  enough that the scores differ in the first digits).
- `fixtures/reward_model/trl_reward.json`:
  - `scores`: rows of token ids (some ending in pad tokens, which transformers skips when it picks
    the scored token) and the `logits` transformers returns for them as one right-padded batch
    with an attention mask.
  - `cases`: `RewardTrainer.compute_loss` on 3 pairs, [chosen; rejected] right-padded as TRL's
    collator pads them, once plain and once with a per-pair `margin` and
    `center_rewards_coefficient = 0.01`: the loss, TRL's logged metrics (accuracy, margin,
    min/mean/max reward) and, after `loss.backward()`, the gradients of `score.weight`,
    `model.norm.weight` and `model.layers.1.mlp.down_proj.weight` in full, plus the global
    gradient norm over every parameter.

How TRL is driven: `RewardTrainer.__new__(RewardTrainer)` skips `__init__` (which would need a
dataset); the attributes `compute_loss` reads are set from a real `RewardConfig` and a real
`accelerate.Accelerator()` on CPU. No loss formula is re-implemented here.
"""

import json
from collections import defaultdict
from pathlib import Path

import torch
import transformers
import trl
from accelerate import Accelerator
from transformers import LlamaConfig, LlamaForSequenceClassification
from trl import RewardConfig, RewardTrainer

assert trl.__version__ == "1.16.0", trl.__version__
assert transformers.__version__ == "5.25.0", transformers.__version__

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "fixtures/models/llama_reward_model"
OUT = ROOT / "fixtures/reward_model/trl_reward.json"
PAD = 0

torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    initializer_range=0.2,
    num_labels=1,
    pad_token_id=PAD,
    bos_token_id=1,
    eos_token_id=2,
)
model = LlamaForSequenceClassification(config).to(torch.float32)
model.eval()
MODEL_DIR.mkdir(parents=True, exist_ok=True)
model.save_pretrained(MODEL_DIR, safe_serialization=True)


def padded(rows):
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


score_rows = [
    [1, 5, 9, 13, 2],
    [1, 7, 3],
    [1, 40, 41, 42, 43, 44, 45, 2],
    [1, 11, 12, 0, 0],  # ends in pad tokens: transformers scores token 12
    [1, 63, 62, 61],
]
ids, mask = padded(score_rows)
with torch.no_grad():
    logits = model(input_ids=ids, attention_mask=mask).logits
scores = {"rows": score_rows, "logits": logits.tolist()}

prompts = [[1, 5, 6], [1, 20, 21, 22], [1, 30]]
chosen = [[7, 8, 2], [23, 2], [31, 32, 33, 34, 2]]
rejected = [[9, 2], [24, 25, 26, 2], [35, 2]]
margins = [0.5, 0.0, 1.25]


def trainer(center):
    t = RewardTrainer.__new__(RewardTrainer)
    t.args = RewardConfig(
        output_dir="/nonexistent", center_rewards_coefficient=center, report_to=[], use_cpu=True, bf16=False
    )
    t.model = model
    t.accelerator = Accelerator(cpu=True)
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    t._total_train_tokens = 0
    t._tp_size = 1
    return t


def case(name, use_margin, center):
    model.train()
    model.zero_grad()
    rows = [p + c for p, c in zip(prompts, chosen)] + [p + r for p, r in zip(prompts, rejected)]
    ids, mask = padded(rows)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if use_margin:
        inputs["margin"] = torch.tensor(margins)
    t = trainer(center)
    loss = t.compute_loss(model, inputs)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())).item()
    metrics = {k: v[0] for k, v in t._metrics["train"].items() if k != "num_tokens"}
    return {
        "name": name,
        "margin": margins if use_margin else None,
        "center_rewards_coefficient": center,
        "loss": loss.item(),
        "metrics": metrics,
        "grad_norm": norm,
        "grads": {
            n: grads[n].flatten().tolist()
            for n in ["score.weight", "model.norm.weight", "model.layers.1.mlp.down_proj.weight"]
        },
    }


out = {
    "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
    "scores": scores,
    "pairs": {"prompts": prompts, "chosen": chosen, "rejected": rejected},
    "cases": [case("plain", False, None), case("margin_center", True, 0.01)],
}
OUT.parent.mkdir(parents=True, exist_ok=True)
OUT.write_text(json.dumps(out, indent=1) + "\n")
print(f"wrote {OUT} and {MODEL_DIR}")
