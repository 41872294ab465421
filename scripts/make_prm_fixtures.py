#!/usr/bin/env python3
"""Oracle for stoke's process reward models (PRMs): a tiny random `LlamaForTokenClassification`
(two labels: 0 = bad step, 1 = good step) with a tiny character tokenizer, the rows of a
PRM800K-style stepwise dataset as TRL 0.29.0's `PRMTrainer.tokenize_row` tokenizes them, and the
loss, accuracy and gradients transformers' token-classification head gives on them.

TRL's PRMTrainer left TRL after 0.29 (TRL 1.16 has none), so the reference is pinned to one file
of the TRL 0.29.0 wheel, `trl/experimental/prm/prm_trainer.py` (sha256 below). That module cannot
be imported next to TRL 1.16, so this script reads the file, takes the source of its
`PRMTrainer.tokenize_row` and `compute_accuracy` with `ast`, and runs that code unchanged. The
loss is what PRMTrainer's `Trainer.compute_loss` returns: the model's own `loss` (transformers'
`ForTokenClassification`: mean cross-entropy over the positions whose label is not -100) on a
batch padded by `DataCollatorForTokenClassification` (PRMTrainer's default collator), with
dropout off (PRMConfig's `disable_dropout = True`).

This installs nothing. Run by hand, once, with the pinned packages (torch==2.15.0,
transformers==5.25.0, tokenizers==0.23.3, numpy) and the TRL 0.29.0 wheel unpacked:

    pip download trl==0.29.0 --no-deps -d $D && unzip -q $D/trl-0.29.0-py3-none-any.whl -d $D/x
    TRL029=$D/x $VENV/bin/python scripts/make_prm_fixtures.py

Everything is seeded, so a rerun rewrites the same bytes. Writes:

- `fixtures/models/llama_prm/`: config.json + model.safetensors (f32) of
  `LlamaForTokenClassification(num_labels=2, pad_token_id=0)` with the tiny config of
  `fixtures/models/llama_reward_model` (vocab 64, hidden 32, 2 layers, 4 heads / 2 KV heads,
  `initializer_range = 0.2`, `torch.manual_seed(0)`); the head's bias, which transformers
  initialises to zero, is drawn from N(0, 0.2) so that a missing bias shows. Plus the tokenizer
  (tokenizer.json, tokenizer_config.json): a BPE over single characters with six merges
  ("th", "the", "is", " is", "= ", and "\\n\\n"), `<s>` as BOS, `<pad>` as padding.
- `fixtures/prm/trl_prm.json`:
  - `rows`: four stepwise rows (`prompt`, `completions`, `labels`).
  - `tokenized`: `tokenize_row` of every row under four settings (`name`, `step_separator`,
    `max_length`, `max_completion_length`, `train_on_last_step_only`, `is_eval`): `input_ids`
    and `labels` per row.
  - `cases`: for the settings `default` and `last_step_only`, the batch of all four rows: the
    logits `[4, T, 2]` of the padded batch, the loss, `compute_accuracy` on the logits, and after
    `loss.backward()` the gradients of `score.weight`, `score.bias`, `model.norm.weight` and
    `model.layers.0.self_attn.k_proj.weight` in full, plus the global gradient norm.
"""

import ast
import hashlib
import json
import os
from itertools import chain
from pathlib import Path

import numpy as np
import tokenizers
import torch
import transformers
from tokenizers import models
from transformers import (
    AutoTokenizer,
    DataCollatorForTokenClassification,
    LlamaConfig,
    LlamaForTokenClassification,
    PreTrainedTokenizerFast,
)
from transformers.trainer_utils import EvalPrediction

assert transformers.__version__ == "5.25.0", transformers.__version__
assert torch.__version__.startswith("2.15.0"), torch.__version__
assert tokenizers.__version__ == "0.23.3", tokenizers.__version__

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "fixtures/models/llama_prm"
OUT = ROOT / "fixtures/prm/trl_prm.json"
if "TRL029" not in os.environ:
    raise SystemExit("set TRL029 to the folder the TRL 0.29.0 wheel is unpacked in (see the header)")
TRL029 = Path(os.environ["TRL029"])
PRM_TRAINER = TRL029 / "trl/experimental/prm/prm_trainer.py"
PRM_TRAINER_SHA256 = "52f81c9c50deef8a92d28dd8b2ec327d7b364fc639df224fb6fa1e004beef2c4"
PAD = 0


def load_trl029():
    """`tokenize_row` and `compute_accuracy` from TRL 0.29.0's prm_trainer.py, unchanged."""
    source = PRM_TRAINER.read_bytes()
    digest = hashlib.sha256(source).hexdigest()
    assert digest == PRM_TRAINER_SHA256, f"{PRM_TRAINER}: sha256 {digest}, not TRL 0.29.0's"
    tree = ast.parse(source)
    wanted = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "compute_accuracy":
            wanted["compute_accuracy"] = node
        if isinstance(node, ast.ClassDef) and node.name == "PRMTrainer":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "tokenize_row":
                    item.decorator_list = []  # a @staticmethod, called here as a function
                    wanted["tokenize_row"] = item
    module = ast.Module(body=list(wanted.values()), type_ignores=[])
    namespace = {"chain": chain, "np": np, "EvalPrediction": EvalPrediction}
    exec(compile(module, str(PRM_TRAINER), "exec"), namespace)
    return namespace["tokenize_row"], namespace["compute_accuracy"]


tokenize_row, compute_accuracy = load_trl029()

# The tokenizer: characters, then six merges, so that some steps encode to fewer tokens than
# characters and "\n\n" is one token (a step separator that is not "\n").
specials = ["<pad>", "<s>", "</s>", "<unk>"]
chars = list("abcdefghijklmnopqrstuvwxyz0123456789") + [" ", "\n", ".", "=", "+", "?", "*"]
merges = [("t", "h"), ("th", "e"), ("i", "s"), (" ", "is"), ("=", " "), ("\n", "\n")]
vocab = {t: i for i, t in enumerate(specials + chars + [a + b for a, b in merges])}
assert len(vocab) <= 64
backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
backend.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in specials])
fast = PreTrainedTokenizerFast(
    tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
)

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
    num_labels=2,
    pad_token_id=PAD,
    bos_token_id=1,
    eos_token_id=2,
)
model = LlamaForTokenClassification(config).to(torch.float32)
with torch.no_grad():
    model.score.bias.copy_(torch.randn(2) * 0.2)
MODEL_DIR.mkdir(parents=True, exist_ok=True)
model.save_pretrained(MODEL_DIR, safe_serialization=True)
fast.save_pretrained(MODEL_DIR)
tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
assert tokenizer.bos_token_id == 1 and tokenizer.pad_token_id == PAD

# PRMTrainer's disable_dropout (PRMConfig default True): every nn.Dropout gets p = 0.
for module in model.modules():
    if isinstance(module, torch.nn.Dropout):
        module.p = 0

rows = [
    {
        "prompt": "what is 2+3?",
        "completions": ["2+3 = 5.", "the answer is 5."],
        "labels": [True, True],
    },
    {
        "prompt": "what is 4*2?",
        "completions": ["4*2 is 6.", "so the answer is 6."],
        "labels": [False, False],
    },
    {
        "prompt": "is 7 odd?",
        "completions": ["7 = 2*3+1.", "7 is odd.", "yes."],
        "labels": [True, True, True],
    },
    {
        "prompt": "what is 9+9?",
        "completions": ["9+9 = 18.", "18 = 2*9.", "thus 19."],
        "labels": [True, True, False],
    },
]

settings = [
    dict(name="default", step_separator="\n", max_length=1024, max_completion_length=None,
         train_on_last_step_only=False, is_eval=False),
    dict(name="last_step_only", step_separator="\n", max_length=1024, max_completion_length=None,
         train_on_last_step_only=True, is_eval=False),
    dict(name="truncated", step_separator="\n", max_length=24, max_completion_length=14,
         train_on_last_step_only=False, is_eval=False),
    dict(name="blank_line_last_step_eval", step_separator="\n\n", max_length=None,
         max_completion_length=None, train_on_last_step_only=True, is_eval=True),
]


def tokenized(setting):
    kwargs = {k: v for k, v in setting.items() if k != "name"}
    return [tokenize_row(row, tokenizer, **kwargs) for row in rows]


def case(setting):
    model.train()
    model.zero_grad()
    features = tokenized(setting)
    batch = DataCollatorForTokenClassification(tokenizer)(features)
    assert batch["input_ids"].shape[1] == max(len(f["input_ids"]) for f in features)
    out = model(**batch)
    loss = out.loss
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())).item()
    accuracy = compute_accuracy(
        EvalPrediction(predictions=out.logits.detach().numpy(), label_ids=batch["labels"].numpy())
    )["accuracy"]
    return {
        "name": setting["name"],
        "logits": out.logits.detach().tolist(),
        "loss": loss.item(),
        "accuracy": accuracy,
        "grad_norm": norm,
        "grads": {
            n: grads[n].flatten().tolist()
            for n in ["score.weight", "score.bias", "model.norm.weight", "model.layers.0.self_attn.k_proj.weight"]
        },
    }


out = {
    "versions": {
        "trl_prm_trainer": "0.29.0 trl/experimental/prm/prm_trainer.py sha256 " + PRM_TRAINER_SHA256,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
    },
    "rows": rows,
    "tokenized": [dict(setting, rows=tokenized(setting)) for setting in settings],
    "cases": [case(settings[0]), case(settings[1])],
}
OUT.parent.mkdir(parents=True, exist_ok=True)
OUT.write_text(json.dumps(out, indent=1) + "\n")
print(f"wrote {OUT} and {MODEL_DIR}")
