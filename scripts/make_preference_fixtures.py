#!/usr/bin/env python3
"""Loss oracle for stoke's preference-optimisation math: runs TRL's own DPO, CPO/SimPO, ORPO and KTO
loss code on fixed random per-token log-probs and writes the losses, gradients and logged metrics
to fixtures/preference/trl_loss.json.

This installs nothing. Run by hand, once, with a Python that has the pinned TRL and torch
(trl==1.16.0, torch==2.15.0; accelerate, transformers, datasets and pandas as TRL needs them):

    $VENV/bin/pip install --no-deps trl==1.16.0 && $VENV/bin/pip install accelerate datasets pandas
    $VENV/bin/python scripts/make_preference_fixtures.py

The inputs come from a seeded `torch.Generator`, so a rerun rewrites the same bytes.

Shared inputs (float64): B = 4 pairs, T = 6 completion slots. `chosen_tok`/`rejected_tok` [B][T]
are per-token policy log-probs in [-3, -0.05] with 0/1 masks `chosen_mask`/`rejected_mask`
(lengths [6, 3, 5, 2] and [4, 6, 1, 5], the masked slots at the end; their values are noise that
must get zero gradient). `ref_chosen`/`ref_rejected` [B] are per-sequence reference log-probs, set
so that the policy-minus-reference log-ratios are chosen [2.1, -1.3, 0.8, -0.6] and rejected
[-1.7, 0.9, 1.4, -2.2] (margins 3.8, -2.2, -0.6, 1.6). KTO is unpaired: `kto_tok`/`kto_mask`
(lengths [5, 2, 6, 3]), `kto_label` [true, false, true, true], `kto_ref` (log-ratios
[1.2, -0.8, -0.5, 0.9]) and the mismatched KL completions `kl_tok`/`kl_mask` (lengths
[4, 6, 2, 5]) with `kl_ref` (log-ratios [0.9, -0.3, 1.1, 0.5], mean 0.55 > 0, so TRL's clamp at 0
does not bite). Every sequence is laid out as TRL's collators would: a 1-token prompt at position 0
followed by the T completion slots, so the input length is L = T + 1 and `completion_mask` =
[0] + mask.

How the real TRL code is driven (no loss formula is re-implemented here; each trainer object is
made with `Trainer.__new__(Trainer)`, skipping `__init__`, which would load a model and a dataset,
and only the attributes the driven method reads are set, copied from a real TRL config object
(`DPOConfig`, `CPOConfig`, `ORPOConfig`, `KTOConfig`) the way each `__init__` copies them, so TRL's
defaults and `__post_init__` rules apply, e.g. `CPOConfig(loss_type="alphapo")` becomes
`loss_type="simpo", cpo_alpha=0`):

- DPO: `trl.trainer.dpo_trainer.DPOTrainer._compute_loss(model, inputs, return_outputs=False)`,
  with `precompute_ref_logps=True` and `ref_chosen_logps`/`ref_rejected_logps` in `inputs`, so no
  reference model runs. The batch is [chosen; rejected] (2B rows). TRL calls
  `model(input_ids=..., attention_mask=..., use_cache=False, labels=labels, fused_lm_head=True)`;
  the stub model returns a `trl.trainer.utils.FusedCausalLMOutput` whose `log_probs` [2B, L-1] is
  cat(chosen_tok, rejected_tok) (two float64 leaves with requires_grad) masked exactly as TRL's
  fused LM head masks it, `masked_fill(labels[:, 1:] == -100, 0)`; `entropy`/`mean_logits` are
  zeros and `is_top1` all false. The metrics come from `trainer._metrics["train"]`. With
  `ld_alpha` set, TRL LD-weights the policy sums only; the precomputed `ref_chosen`/`ref_rejected`
  are used as given (TRL's precompute pass would have LD-weighted them the same way).
- CPO/SimPO/AlphaPO: `trl.experimental.cpo.CPOTrainer.get_batch_loss_metrics(model, batch)`,
  running TRL's real `concatenated_forward` (so `concatenated_inputs`, `get_batch_logps` with its
  sum-vs-average choice, and the chosen NLL `cross_entropy_loss` are TRL's). The batch has
  `chosen_/rejected_input_ids`, `_attention_mask` and `_labels` (-100 on the prompt and on masked
  slots; completion token id 0). The stub model returns `logits` over a 2-token vocabulary:
  position j (predicting token j+1) gets [lp, log(-expm1(lp))] with lp = the leaf's slot j, so
  log_softmax at token 0 is exactly lp (the log-sum-exp is log(e^lp + 1 - e^lp) = 0, and its
  derivative cancels, so d log_softmax / d lp = 1); the last position gets zero logits. The
  script checks that TRL's `concatenated_forward` reproduces the masked sum (or mean) of the leaf
  and -sum/count for the NLL to 1e-12.
- ORPO: `trl.experimental.orpo.ORPOTrainer.get_batch_loss_metrics(model, batch)`, driven like CPO
  (TRL's real `concatenated_forward`, the same 2-token-vocabulary stub model). The attention mask
  is 0 on the masked slots, so the NLL over "prompt and response" that ORPO computes covers the
  completion tokens only (the 1-token prompt is never a shifted label).
- KTO: `trl.trainer.kto_trainer.KTOTrainer._compute_loss(model, inputs, return_outputs=False)`
  with `precompute_ref_logps=True` (`ref_logps` and `ref_KL_logps` in the batch) and
  `calculate_KL` set as `__init__` sets it (`loss_type != "apo_zero_unpaired"`). TRL calls the
  model twice, once on `KL_input_ids` (under `torch.no_grad`) and once on `input_ids`; the stub
  tells them apart by the prompt token (1 for the main sequences, 2 for the KL ones) and returns
  kto_tok or kl_tok the same way as for DPO. Since the KL forward runs under no_grad, torch leaves
  `kl_tok.grad` as None; the fixture writes zeros for it (the derivative is zero).

Metrics: every metric TRL logs is recorded except the ones computed only from the stub's fake
fields: DPO/KTO `entropy`, `num_tokens`, `logits/chosen`, `logits/rejected` and (DPO)
`mean_token_accuracy`; CPO/ORPO `logits/chosen`, `logits/rejected` (means of the stub's 2-token
logits).

Precision: every case is float64 end to end except these, flagged by each case's "dtype"/"note"
(the 2-token logits of the CPO/ORPO stub add only ulp-level noise, about 1e-17, to the gradients):
- `dpo_sigmoid_alpha_divergence` runs in float32 (inputs cast to float32): TRL 1.16's
  alpha-divergence branch looks up `clamp_max = {float16: 11, bfloat16: 80, float32: 80}[dtype]`,
  which raises KeyError for float64 log-ratios.
- ORPO (both cases): `odds_ratio_loss` casts the log-probs to float32 (`.float()`), so its odds-ratio term and
  its gradient carry float32 precision even though inputs, NLL and the returned loss are float64.

Requested cases skipped, with the reason:
- DPO sigmoid with label_smoothing 0.2: TRL 1.16's "sigmoid" branch is `-logsigmoid(beta * delta)`
  and never reads `label_smoothing` (only exo_pair, robust, aot and aot_unpaired do), so the case
  would equal dpo_sigmoid.
Every other requested case exists in TRL 1.16. AlphaPO is not a separate loss in CPO: "alphapo" is
config sugar for `loss_type="simpo", cpo_alpha=0` with `alpha != 0`; the case uses alpha 0.25 with
the SimPO case's beta 2.0 and simpo_gamma 0.5.
"""

import json
import math
import os
import sys
import tempfile
import types
import warnings
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import trl  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from trl import DPOConfig, KTOConfig  # noqa: E402
from trl.experimental.cpo import CPOConfig, CPOTrainer  # noqa: E402
from trl.experimental.orpo import ORPOConfig, ORPOTrainer  # noqa: E402
from trl.trainer.dpo_trainer import DPOTrainer  # noqa: E402
from trl.trainer.kto_trainer import KTOTrainer  # noqa: E402
from trl.trainer.utils import FusedCausalLMOutput  # noqa: E402

TRL_VERSION = "1.16.0"
TORCH_VERSION = "2.15.0"
B, T = 4, 6
L = T + 1  # 1-token prompt + T completion slots
SEED = 20261201

CHOSEN_LENGTHS = [6, 3, 5, 2]
REJECTED_LENGTHS = [4, 6, 1, 5]
CHOSEN_LOGRATIOS = [2.1, -1.3, 0.8, -0.6]
REJECTED_LOGRATIOS = [-1.7, 0.9, 1.4, -2.2]
KTO_LENGTHS = [5, 2, 6, 3]
KTO_LABELS = [True, False, True, True]
KTO_LOGRATIOS = [1.2, -0.8, -0.5, 0.9]
KL_LENGTHS = [4, 6, 2, 5]
KL_LOGRATIOS = [0.9, -0.3, 1.1, 0.5]

# Metrics computed only from fields the stub model fakes.
STUB_METRICS = {"entropy", "num_tokens", "logits/chosen", "logits/rejected", "mean_token_accuracy"}

# (name, DPOConfig fields)
DPO_CASES = [
    ("dpo_sigmoid", dict(loss_type=["sigmoid"])),
    ("dpo_hinge", dict(loss_type=["hinge"])),
    ("dpo_ipo", dict(loss_type=["ipo"])),
    ("dpo_exo_pair", dict(loss_type=["exo_pair"], label_smoothing=1e-3)),
    ("dpo_nca_pair", dict(loss_type=["nca_pair"])),
    ("dpo_robust", dict(loss_type=["robust"], label_smoothing=0.1)),
    ("dpo_bco_pair", dict(loss_type=["bco_pair"])),
    ("dpo_sppo_hard", dict(loss_type=["sppo_hard"])),
    ("dpo_aot", dict(loss_type=["aot"])),
    ("dpo_aot_unpaired", dict(loss_type=["aot_unpaired"])),
    ("dpo_apo_zero", dict(loss_type=["apo_zero"])),
    ("dpo_apo_down", dict(loss_type=["apo_down"])),
    ("dpo_discopop", dict(loss_type=["discopop"], discopop_tau=0.05)),
    ("dpo_sft", dict(loss_type=["sft"])),
    ("dpo_sigmoid_norm", dict(loss_type=["sigmoid_norm"])),
    ("dpo_sigmoid_beta0.5", dict(loss_type=["sigmoid"], beta=0.5)),
    ("dpo_mpo", dict(loss_type=["sigmoid", "bco_pair", "sft"], loss_weights=[0.8, 0.2, 1.0])),
    ("dpo_sigmoid_forward_kl", dict(loss_type=["sigmoid"], f_divergence_type="forward_kl")),
    ("dpo_sigmoid_js_divergence", dict(loss_type=["sigmoid"], f_divergence_type="js_divergence")),
    (
        "dpo_sigmoid_alpha_divergence",
        dict(loss_type=["sigmoid"], f_divergence_type="alpha_divergence", f_alpha_divergence_coef=0.5),
    ),
    ("dpo_sigmoid_ld_alpha0.5", dict(loss_type=["sigmoid"], ld_alpha=0.5)),
]
# TRL 1.16 raises KeyError in the alpha-divergence clamp table for float64; run that case in float32.
FLOAT32_CASES = {"dpo_sigmoid_alpha_divergence"}

CPO_CASES = [
    ("cpo_sigmoid", dict(loss_type="sigmoid", beta=0.1, cpo_alpha=1.0)),
    ("cpo_hinge", dict(loss_type="hinge", beta=0.1, cpo_alpha=1.0)),
    ("cpo_ipo", dict(loss_type="ipo", beta=0.1, cpo_alpha=1.0)),
    ("simpo", dict(loss_type="simpo", beta=2.0, cpo_alpha=0.0, simpo_gamma=0.5)),
    ("simpo_cpo_alpha0.5", dict(loss_type="simpo", beta=2.0, cpo_alpha=0.5, simpo_gamma=0.5)),
    ("alphapo", dict(loss_type="alphapo", beta=2.0, simpo_gamma=0.5, alpha=0.25)),
]

ORPO_CASES = [
    ("orpo_beta0.1", dict(beta=0.1)),
    ("orpo_beta0.5", dict(beta=0.5)),
]

KTO_CASES = [
    ("kto", dict(loss_type="kto", beta=0.1, desirable_weight=1.0, undesirable_weight=1.0)),
    ("kto_weighted_beta0.3", dict(loss_type="kto", beta=0.3, desirable_weight=1.33, undesirable_weight=1.0)),
    ("kto_apo_zero_unpaired", dict(loss_type="apo_zero_unpaired", beta=0.1)),
]


def length_mask(lengths):
    mask = torch.zeros(len(lengths), T, dtype=torch.float64)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1.0
    return mask


def make_inputs():
    gen = torch.Generator().manual_seed(SEED)

    def tok():
        return -0.05 - 2.95 * torch.rand(B, T, generator=gen, dtype=torch.float64)

    chosen_tok, rejected_tok, kto_tok, kl_tok = tok(), tok(), tok(), tok()
    chosen_mask, rejected_mask = length_mask(CHOSEN_LENGTHS), length_mask(REJECTED_LENGTHS)
    kto_mask, kl_mask = length_mask(KTO_LENGTHS), length_mask(KL_LENGTHS)

    def ref(tokens, mask, logratios):
        return (tokens * mask).sum(1) - torch.tensor(logratios, dtype=torch.float64)

    return {
        "chosen_tok": chosen_tok,
        "chosen_mask": chosen_mask,
        "rejected_tok": rejected_tok,
        "rejected_mask": rejected_mask,
        "ref_chosen": ref(chosen_tok, chosen_mask, CHOSEN_LOGRATIOS),
        "ref_rejected": ref(rejected_tok, rejected_mask, REJECTED_LOGRATIOS),
        "kto_tok": kto_tok,
        "kto_mask": kto_mask,
        "kto_label": torch.tensor(KTO_LABELS),
        "kto_ref": ref(kto_tok, kto_mask, KTO_LOGRATIOS),
        "kl_tok": kl_tok,
        "kl_mask": kl_mask,
        "kl_ref": ref(kl_tok, kl_mask, KL_LOGRATIOS),
    }


def sequence_tensors(mask, prompt_token):
    """input_ids / attention_mask / completion_mask [rows, L] for a 1-token prompt + T slots."""
    rows = mask.size(0)
    completion = mask.long()
    input_ids = torch.zeros(rows, L, dtype=torch.long)
    input_ids[:, 0] = prompt_token
    completion_mask = torch.cat([torch.zeros(rows, 1, dtype=torch.long), completion], dim=1)
    attention_mask = torch.cat([torch.ones(rows, 1, dtype=torch.long), completion], dim=1)
    return input_ids, attention_mask, completion_mask


def fused_output(per_token, labels):
    """What TRL's fused LM head returns: per-token log-probs, 0 where the shifted label is -100."""
    mask = labels[:, 1:] != -100
    zeros = torch.zeros(mask.shape, dtype=per_token.dtype)
    return FusedCausalLMOutput(
        loss=None,
        log_probs=per_token.masked_fill(~mask, 0.0),
        entropy=zeros,
        log_sum_sq_probs=None,
        mean_logits=zeros,
        is_top1=torch.zeros(mask.shape, dtype=torch.bool),
        label_mask=mask,
        aux_loss=None,
    )


def two_token_logits(per_token):
    """[rows, T] log-probs -> [rows, L, 2] logits whose log_softmax at token 0, position j, is per_token[:, j]."""
    logits = torch.stack([per_token, torch.log(-torch.expm1(per_token))], dim=-1)
    last = torch.zeros(per_token.size(0), 1, 2, dtype=per_token.dtype)
    return torch.cat([logits, last], dim=1)


def base_trainer(cls, config):
    trainer = cls.__new__(cls)
    trainer.args = config
    trainer.accelerator = Accelerator(cpu=True)
    trainer.model = torch.nn.Linear(1, 1).train()
    trainer.aux_loss_enabled = False
    return trainer


def config_kwargs(tmpdir):
    return dict(output_dir=tmpdir, report_to=[], bf16=False, use_cpu=True)


def leaves(data, names, dtype):
    return {name: data[name].to(dtype).clone().requires_grad_(True) for name in names}


def grads(leaf_map):
    out = {}
    for name, leaf in leaf_map.items():
        g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        out[name] = g.to(torch.float64)
    return out


def clean_metrics(metrics):
    return {k: float(v) for k, v in sorted(metrics.items()) if k not in STUB_METRICS}


def run_dpo(name, fields, data, tmpdir):
    dtype = torch.float32 if name in FLOAT32_CASES else torch.float64
    config = DPOConfig(**config_kwargs(tmpdir), precompute_ref_log_probs=True, **fields)
    trainer = base_trainer(DPOTrainer, config)
    # As DPOTrainer.__init__ copies them.
    trainer.beta = config.beta
    trainer.precompute_ref_logps = config.precompute_ref_log_probs
    trainer.loss_types = config.loss_type
    trainer.loss_weights = config.loss_weights or [1.0] * len(trainer.loss_types)
    trainer.ld_alpha = config.ld_alpha
    trainer.f_divergence_type = config.f_divergence_type
    trainer.f_alpha_divergence_coef = config.f_alpha_divergence_coef
    trainer.label_smoothing = config.label_smoothing
    trainer.use_weighting = config.use_weighting
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer._total_train_tokens = 0
    trainer._tp_size = 1

    leaf = leaves(data, ["chosen_tok", "rejected_tok"], dtype)
    mask = torch.cat([data["chosen_mask"], data["rejected_mask"]])
    input_ids, attention_mask, completion_mask = sequence_tensors(mask, prompt_token=1)

    def model(input_ids, attention_mask, use_cache, labels, fused_lm_head):
        assert fused_lm_head and labels.shape == (2 * B, L)
        return fused_output(torch.cat([leaf["chosen_tok"], leaf["rejected_tok"]]), labels)

    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "completion_mask": completion_mask,
        "ref_chosen_logps": data["ref_chosen"].to(dtype),
        "ref_rejected_logps": data["ref_rejected"].to(dtype),
    }
    loss = trainer._compute_loss(model, inputs, return_outputs=False)
    loss.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    case_config = {
        "beta": config.beta,
        "loss_type": list(config.loss_type),
        "loss_weights": list(trainer.loss_weights),
        "label_smoothing": config.label_smoothing,
        "f_divergence_type": config.f_divergence_type,
        "f_alpha_divergence_coef": config.f_alpha_divergence_coef,
        "ld_alpha": config.ld_alpha,
        "discopop_tau": config.discopop_tau,
    }
    note = None
    if dtype == torch.float32:
        note = "float32: TRL 1.16's alpha-divergence clamp table has no float64 entry (KeyError)"
    return finish(name, "dpo", dtype, case_config, loss, grads(leaf), metrics, note)


def preference_batch(data):
    batch = {}
    for side in ("chosen", "rejected"):
        input_ids, attention_mask, completion_mask = sequence_tensors(data[f"{side}_mask"], prompt_token=1)
        batch[f"{side}_input_ids"] = input_ids
        batch[f"{side}_attention_mask"] = attention_mask
        batch[f"{side}_labels"] = input_ids.masked_fill(completion_mask == 0, -100)
    return batch


def logits_model(leaf):
    def model(input_ids, attention_mask, use_cache):
        assert input_ids.shape == (2 * B, L)
        return types.SimpleNamespace(logits=two_token_logits(torch.cat([leaf["chosen_tok"], leaf["rejected_tok"]])))

    return model


def check_forward(trainer, model, batch, data, average):
    """Cross-check of the stub: TRL's concatenated_forward must give the masked sum/mean and the NLL."""
    with torch.no_grad():
        out = trainer.concatenated_forward(model, batch)
    cm, rm = data["chosen_mask"], data["rejected_mask"]
    c_sum, r_sum = (data["chosen_tok"] * cm).sum(1), (data["rejected_tok"] * rm).sum(1)
    want_c = c_sum / cm.sum(1) if average else c_sum
    want_r = r_sum / rm.sum(1) if average else r_sum
    assert torch.allclose(out[0], want_c, rtol=0, atol=1e-12), (out[0], want_c)
    assert torch.allclose(out[1], want_r, rtol=0, atol=1e-12), (out[1], want_r)
    return out[4]


def run_cpo(name, fields, data, tmpdir):
    config = CPOConfig(**config_kwargs(tmpdir), **fields)
    trainer = base_trainer(CPOTrainer, config)
    # As CPOTrainer.__init__ copies them.
    trainer.is_encoder_decoder = False
    trainer.pad_token_id = 0
    trainer.beta = config.beta
    trainer.label_smoothing = config.label_smoothing
    trainer.loss_type = config.loss_type
    trainer.cpo_alpha = config.cpo_alpha
    if config.loss_type == "simpo":
        trainer.simpo_gamma = config.simpo_gamma
    trainer.alpha = config.alpha

    leaf = leaves(data, ["chosen_tok", "rejected_tok"], torch.float64)
    model = logits_model(leaf)
    batch = preference_batch(data)
    nll = check_forward(trainer, model, batch, data, average=config.loss_type in ("ipo", "simpo"))
    if config.cpo_alpha != 0:
        cm = data["chosen_mask"]
        want = -(data["chosen_tok"] * cm).sum() / cm.sum()
        assert abs(nll.item() - want.item()) < 1e-12, (nll, want)

    loss, metrics = trainer.get_batch_loss_metrics(model, batch, train_eval="train")
    loss.backward()
    case_config = {
        "beta": config.beta,
        "loss_type": config.loss_type,
        "label_smoothing": config.label_smoothing,
        "cpo_alpha": config.cpo_alpha,
        "simpo_gamma": config.simpo_gamma,
        "alpha": config.alpha,
    }
    if fields["loss_type"] != config.loss_type:
        case_config["requested_loss_type"] = fields["loss_type"]
    return finish(name, "cpo", torch.float64, case_config, loss, grads(leaf), metrics, None)


def run_orpo(name, fields, data, tmpdir):
    config = ORPOConfig(**config_kwargs(tmpdir), **fields)
    trainer = base_trainer(ORPOTrainer, config)
    # As ORPOTrainer.__init__ copies them.
    trainer.is_encoder_decoder = False
    trainer.padding_value = 0
    trainer.beta = config.beta

    leaf = leaves(data, ["chosen_tok", "rejected_tok"], torch.float64)
    model = logits_model(leaf)
    batch = preference_batch(data)
    nll = check_forward(trainer, model, batch, data, average=True)
    cm = data["chosen_mask"]
    want = -(data["chosen_tok"] * cm).sum() / cm.sum()
    assert abs(nll.item() - want.item()) < 1e-12, (nll, want)

    loss, metrics = trainer.get_batch_loss_metrics(model, batch, train_eval="train")
    loss.backward()
    note = "TRL's odds_ratio_loss casts the log-probs to float32: that term and its gradient have float32 precision"
    return finish(name, "orpo", torch.float64, {"beta": config.beta}, loss, grads(leaf), metrics, note)


def run_kto(name, fields, data, tmpdir):
    config = KTOConfig(**config_kwargs(tmpdir), precompute_ref_log_probs=True, **fields)
    trainer = base_trainer(KTOTrainer, config)
    # As KTOTrainer.__init__ copies them.
    trainer.beta = config.beta
    trainer.precompute_ref_logps = config.precompute_ref_log_probs
    trainer.loss_type = config.loss_type
    trainer.desirable_weight = config.desirable_weight
    trainer.undesirable_weight = config.undesirable_weight
    trainer.calculate_KL = config.loss_type not in ["apo_zero_unpaired"]
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer._total_train_tokens = 0
    trainer._tp_size = 1

    leaf = leaves(data, ["kto_tok", "kl_tok"], torch.float64)
    input_ids, attention_mask, completion_mask = sequence_tensors(data["kto_mask"], prompt_token=1)
    kl_input_ids, kl_attention_mask, kl_completion_mask = sequence_tensors(data["kl_mask"], prompt_token=2)
    calls = []

    def model(input_ids, attention_mask, use_cache, labels, fused_lm_head):
        assert fused_lm_head and labels.shape == (B, L)
        which = {1: "kto_tok", 2: "kl_tok"}[int(input_ids[0, 0])]
        calls.append((which, torch.is_grad_enabled()))
        return fused_output(leaf[which], labels)

    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "completion_mask": completion_mask,
        "label": data["kto_label"].clone(),
        "ref_logps": data["kto_ref"],
    }
    if trainer.calculate_KL:
        inputs.update(
            {
                "KL_input_ids": kl_input_ids,
                "KL_attention_mask": kl_attention_mask,
                "KL_completion_mask": kl_completion_mask,
                "ref_KL_logps": data["kl_ref"],
            }
        )
    loss = trainer._compute_loss(model, inputs, return_outputs=False)
    loss.backward()
    want_calls = [("kl_tok", False), ("kto_tok", True)] if trainer.calculate_KL else [("kto_tok", True)]
    assert calls == want_calls, calls
    assert leaf["kl_tok"].grad is None  # the KL forward runs under torch.no_grad
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    case_config = {
        "beta": config.beta,
        "loss_type": config.loss_type,
        "desirable_weight": config.desirable_weight,
        "undesirable_weight": config.undesirable_weight,
    }
    note = None
    if not trainer.calculate_KL:
        note = "apo_zero_unpaired: calculate_KL is False, no KL forward runs and kl is 0"
    case = finish(name, "kto", torch.float64, case_config, loss, grads(leaf), metrics, note)
    case["kl"] = float(metrics["kl"])
    return case


def finish(name, trainer, dtype, config, loss, grad, metrics, note):
    case = {
        "name": name,
        "trainer": trainer,
        "dtype": str(dtype).removeprefix("torch."),
        "config": config,
        "loss": loss.item(),
        "grad": {k: v.tolist() for k, v in grad.items()},
        "metrics": clean_metrics(metrics),
    }
    if note is not None:
        case["note"] = note
    return case


def sanity_checks(cases, data):
    masks = {
        "chosen_tok": data["chosen_mask"],
        "rejected_tok": data["rejected_mask"],
        "kto_tok": data["kto_mask"],
        "kl_tok": data["kl_mask"],
    }
    for case in cases:
        assert math.isfinite(case["loss"]), case["name"]
        for key, g in case["grad"].items():
            g = torch.tensor(g, dtype=torch.float64)
            assert torch.isfinite(g).all(), (case["name"], key)
            outside = g[masks[key] == 0]
            assert (outside == 0).all(), (case["name"], key, outside)
        for key, value in case["metrics"].items():
            assert math.isfinite(value), (case["name"], key)
    # Hand cross-check (the fixture values are TRL's): dpo_sigmoid = -logsigmoid(beta * delta).mean().
    by_name = {case["name"]: case for case in cases}
    c = (data["chosen_tok"] * data["chosen_mask"]).sum(1) - data["ref_chosen"]
    r = (data["rejected_tok"] * data["rejected_mask"]).sum(1) - data["ref_rejected"]
    want = -F.logsigmoid(0.1 * (c - r)).mean().item()
    got = by_name["dpo_sigmoid"]["loss"]
    assert abs(got - want) < 1e-12, (got, want)
    # Every case has a gradient somewhere inside the masks (the KL completions excepted).
    for case in cases:
        inside = sum(abs(x) for key, g in case["grad"].items() if key != "kl_tok" for row in g for x in row)
        assert inside > 0, case["name"]


def main():
    if trl.__version__ != TRL_VERSION:
        sys.exit(f"expected trl {TRL_VERSION}, found {trl.__version__}")
    if torch.__version__.split("+")[0] != TORCH_VERSION:
        sys.exit(f"expected torch {TORCH_VERSION}, found {torch.__version__}")
    warnings.filterwarnings("ignore", category=FutureWarning)
    data = make_inputs()
    with tempfile.TemporaryDirectory() as tmpdir:
        cases = [run_dpo(n, f, data, tmpdir) for n, f in DPO_CASES]
        cases += [run_cpo(n, f, data, tmpdir) for n, f in CPO_CASES]
        cases += [run_orpo(n, f, data, tmpdir) for n, f in ORPO_CASES]
        cases += [run_kto(n, f, data, tmpdir) for n, f in KTO_CASES]
    sanity_checks(cases, data)

    inputs = {}
    for key, value in data.items():
        if key.endswith("_mask"):
            inputs[key] = [[int(x) for x in row] for row in value.tolist()]
        else:
            inputs[key] = value.tolist()
    out = {
        "generator": "scripts/make_preference_fixtures.py",
        "trl_version": trl.__version__,
        "torch_version": torch.__version__,
        "inputs": inputs,
        "cases": cases,
    }
    path = Path(__file__).resolve().parent.parent / "fixtures" / "preference" / "trl_loss.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # One line per input and per case: small, and diffs stay readable.
    head = [key for key in out if key not in ("inputs", "cases")]
    lines = [f" {json.dumps(key)}: {json.dumps(out[key])}" for key in head]
    input_lines = ",\n".join(f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in inputs.items())
    case_lines = ",\n".join(f"  {json.dumps(case)}" for case in cases)
    text = "{\n" + ",\n".join(lines) + ',\n "inputs": {\n' + input_lines + "\n },\n"
    path.write_text(text + ' "cases": [\n' + case_lines + "\n ]\n}\n")
    json.loads(path.read_text())
    for case in cases:
        print(f"{case['name']:32s} {case['trainer']:5s} {case['dtype']:8s} loss {case['loss']:.12g}")
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(cases)} cases)")


if __name__ == "__main__":
    main()
