#!/usr/bin/env python3
"""Golden fixtures for stoke-optim: several optimizer steps of PyTorch's AdamW and Muon.

What it is: a hand-run generator of fixtures/optim/optimizer_steps.json, which
crates/optim/tests/torch_parity.rs replays through `stoke_optim::Optimizer` (same parameter
names, initial values, gradients and lr factors) and compares parameter by parameter after
every step.

Two cases, both with HF parameter names so that stoke's `classify` puts every tensor in the
group PyTorch used here:
- "adamw": torch.optim.AdamW (foreach=False, the single-tensor path) with two parameter groups:
  weight decay on the hidden matrix and the output head, none on the embedding, norm and bias.
- "muon": hidden matrices (one wide, one tall, so the transpose path is covered) under Muon with
  adjust_lr_fn="match_rms_adamw", momentum 0.95, Nesterov, 5 Newton-Schulz steps, weight decay;
  the other tensors under torch.optim.AdamW as above.

Muon and bfloat16: torch.optim.Muon (torch 2.15, `_zeropower_via_newtonschulz`) runs the
Newton-Schulz iteration in bfloat16, which stoke does not (it computes in float32). So the Muon
matrices' reference values come from `muon_step_f32` below, a float32 re-implementation that
follows torch's `_single_tensor_muon` and `_zeropower_via_newtonschulz` line by line with the
bfloat16 cast removed. The script ALSO runs torch.optim.Muon itself on the same inputs and
asserts that it agrees with the float32 re-implementation within bfloat16 tolerance (the largest
difference is stored in the fixture as `torch_bf16_max_abs_diff`).

What it is not: part of CI (CI never runs Python ML packages; the output is committed).

Invariants: seeded and deterministic; lr factors vary per step (as a schedule would), applied by
setting each group's lr to base_lr * factor before the step, which is what stoke's `lr_factor`
means.

Usage:
    $VENV/bin/python scripts/make_optim_fixtures.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "optim" / "optimizer_steps.json"

LR_FACTORS = [1.0, 0.5, 0.25, 1.0]

ADAMW = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
MUON = {
    "lr": 2e-2,
    "momentum": 0.95,
    "nesterov": True,
    "ns_steps": 5,
    "weight_decay": 0.1,
    "adamw": ADAMW,
}

# (name, shape, takes weight decay in the AdamW groups)
ADAMW_PARAMS = [
    ("model.embed_tokens.weight", (6, 4), False),
    ("model.layers.0.mlp.up_proj.weight", (5, 4), True),
    ("model.layers.0.self_attn.q_proj.bias", (5,), False),
    ("model.norm.weight", (4,), False),
    ("lm_head.weight", (6, 4), True),
]
# The Muon optimizer's AdamW-handled tensors: everything but hidden matrices.
MUON_ADAMW_PARAMS = [spec for spec in ADAMW_PARAMS if spec[0] != "model.layers.0.mlp.up_proj.weight"]
MUON_MATRICES = [
    ("model.layers.0.self_attn.q_proj.weight", (4, 7)),  # wide
    ("model.layers.0.mlp.down_proj.weight", (7, 3)),  # tall: transposed inside Newton-Schulz
]
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


def tensors(seed: int, specs) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Initial values and per-step gradients, seeded. Gradient scales vary per step so that the
    second moment does not simply track the first."""
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(shape, generator=gen, dtype=torch.float32) * 0.5 for _, shape, *_ in specs]
    grads = [
        [torch.randn(shape, generator=gen, dtype=torch.float32) * (0.1 + 0.3 * step) for _, shape, *_ in specs]
        for step in range(len(LR_FACTORS))
    ]
    return init, grads


def adamw_groups(params, specs, config):
    decay = [p for p, (_, _, wd) in zip(params, specs) if wd]
    no_decay = [p for p, (_, _, wd) in zip(params, specs) if not wd]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config["weight_decay"]},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config["lr"],
        betas=(config["beta1"], config["beta2"]),
        eps=config["eps"],
        foreach=False,
    )


def run_torch(optimizer, params, grads, base_lrs):
    """Steps `optimizer` through all lr factors; returns every parameter after every step."""
    after = []
    for step, factor in enumerate(LR_FACTORS):
        for group, base in zip(optimizer.param_groups, base_lrs):
            group["lr"] = base * factor
        for p, g in zip(params, grads[step]):
            p.grad = g.clone()
        optimizer.step()
        after.append([p.detach().clone() for p in params])
    return after


def zeropower_f32(grad: torch.Tensor, ns_coefficients, ns_steps: int, eps: float) -> torch.Tensor:
    """torch.optim._muon._zeropower_via_newtonschulz without the bfloat16 cast."""
    a, b, c = ns_coefficients
    ortho_grad = grad.to(dtype=torch.float32, copy=True)
    if grad.size(0) > grad.size(1):
        ortho_grad = ortho_grad.T
    ortho_grad.div_(ortho_grad.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram_matrix = ortho_grad @ ortho_grad.T
        gram_update = torch.addmm(gram_matrix, gram_matrix, gram_matrix, beta=b, alpha=c)
        ortho_grad = torch.addmm(ortho_grad, gram_update, ortho_grad, beta=a)
    if grad.size(0) > grad.size(1):
        ortho_grad = ortho_grad.T
    return ortho_grad


def muon_step_f32(param, grad, buf, lr, config):
    """torch.optim._muon._single_tensor_muon for one parameter, float32 throughout, with
    adjust_lr_fn="match_rms_adamw"."""
    momentum = config["momentum"]
    buf.lerp_(grad, 1 - momentum)
    update = grad.lerp(buf, momentum) if config["nesterov"] else buf
    update = zeropower_f32(update, NS_COEFFICIENTS, config["ns_steps"], NS_EPS)
    rows, cols = param.shape[:2]
    adjusted_lr = lr * 0.2 * math.sqrt(max(rows, cols))
    param.mul_(1 - lr * config["weight_decay"])
    param.add_(update, alpha=-adjusted_lr)


def run_muon_f32(init, grads, config):
    params = [p.clone() for p in init]
    bufs = [torch.zeros_like(p) for p in params]
    after = []
    for step, factor in enumerate(LR_FACTORS):
        for p, g, buf in zip(params, grads[step], bufs):
            muon_step_f32(p, g, buf, config["lr"] * factor, config)
        after.append([p.clone() for p in params])
    return after


def run_muon_torch(init, grads, config):
    params = [torch.nn.Parameter(p.clone()) for p in init]
    optimizer = torch.optim.Muon(
        params,
        lr=config["lr"],
        weight_decay=config["weight_decay"],
        momentum=config["momentum"],
        nesterov=config["nesterov"],
        ns_steps=config["ns_steps"],
        adjust_lr_fn="match_rms_adamw",
    )
    return run_torch(optimizer, params, grads, [config["lr"]])


def as_list(t: torch.Tensor) -> list[float]:
    return [float(x) for x in t.flatten().tolist()]


def records(specs, init, grads, after):
    return [
        {
            "name": spec[0],
            "shape": list(spec[1]),
            "initial": as_list(init[i]),
            "grads": [as_list(grads[s][i]) for s in range(len(LR_FACTORS))],
            "after": [as_list(after[s][i]) for s in range(len(LR_FACTORS))],
        }
        for i, spec in enumerate(specs)
    ]


def adamw_case(seed: int, config, specs) -> list[dict]:
    init, grads = tensors(seed, specs)
    params = [torch.nn.Parameter(p.clone()) for p in init]
    optimizer = adamw_groups(params, specs, config)
    after = run_torch(optimizer, params, grads, [config["lr"], config["lr"]])
    return records(specs, init, grads, after)


def main() -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    adamw = adamw_case(1, ADAMW, ADAMW_PARAMS)

    # Muon case: the AdamW-handled tensors of the Muon optimizer, then its matrices.
    muon_adamw = adamw_case(2, MUON["adamw"], MUON_ADAMW_PARAMS)
    init, grads = tensors(3, MUON_MATRICES)
    f32_after = run_muon_f32(init, grads, MUON)
    torch_after = run_muon_torch(init, grads, MUON)
    max_diff = max(
        float((f - t).abs().max())
        for fs, ts in zip(f32_after, torch_after)
        for f, t in zip(fs, ts)
    )
    # bf16 keeps 8 significant bits (relative precision 2^-8 = 0.0039); an update element is
    # about adjusted_lr (~0.1 here) in size, and four steps accumulate, so torch's bf16 result
    # may differ from the float32 one by a few 1e-3 but not by a whole update.
    largest_update = MUON["lr"] * 0.2 * math.sqrt(7)
    assert max_diff < 0.05 * largest_update * len(LR_FACTORS), (
        f"torch.optim.Muon (bf16 Newton-Schulz) and the float32 re-implementation differ by "
        f"{max_diff}, more than bf16 rounding explains"
    )
    muon_matrices = records(MUON_MATRICES, init, grads, f32_after)

    fixture = {
        "generator": "scripts/make_optim_fixtures.py",
        "torch_version": torch.__version__,
        "lr_factors": LR_FACTORS,
        "adamw": {"config": {"kind": "adamw", **ADAMW}, "params": adamw},
        "muon": {
            "config": {"kind": "muon", **MUON},
            "params": muon_adamw + muon_matrices,
            "torch_bf16_max_abs_diff": max_diff,
        },
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes); torch bf16 Muon vs f32: max |diff| {max_diff:.3g}")


if __name__ == "__main__":
    main()
