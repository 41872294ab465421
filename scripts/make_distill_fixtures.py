#!/usr/bin/env python3
"""Loss oracle for stoke's logit distillation: runs TRL's own `GKDTrainer.generalized_jsd_loss`
on fixed random logits and writes the losses and the gradients with respect to the student's
logits to fixtures/distill/trl_gkd.json.

This installs nothing. Run by hand, once, with a Python that has the pinned TRL and torch
(trl==1.16.0, torch==2.15.0, as scripts/make_preference_fixtures.py):

    $VENV/bin/python scripts/make_distill_fixtures.py

Inputs (float64, from a seeded `torch.Generator`, so a rerun writes the same bytes):
B = 2 sequences, S = 5 positions, V = 13 vocabulary entries; `student` and `teacher` logits
[B][S][V] uniform in [-4, 4]; `labels` [B][S] with -100 on the prompt and padding positions
(lengths of the completion: 3 and 4). Cases: beta in {0, 0.5, 1} x temperature in {1, 2},
each with `labels` (masked: TRL divides the summed divergence by the number of unmasked
positions) and without (the full rows: TRL's "batchmean" then divides by B, the batch size).
The gradient is d loss / d student logits [B][S][V] by torch autograd through TRL's code.

A second file, fixtures/distill/trl_topk.json, holds the sparse (top-k) divergence of TRL's
server distillation (`trl.experimental.server_distillation`: `_add_tail_bucket`, the "rest of
mass" bucket log(1 - sum of the top-k probabilities), and `_jsd_divergence` with a support mask),
what a remote teacher that returns only its top-k log-probs allows: the teacher's top-k ids and
log-probs (from the same teacher logits at temperature 1; at one position the k-th is -inf, as a
server that returned fewer), the student's log-softmax at temperature T gathered at those ids,
both with the tail bucket, the divergence summed over the K + 1 entries and averaged over the
`labels` positions (TRL's batchmean). Cases: k in {1, 3} x beta in {0, 0.5, 1} x temperature in
{1, 2} (TRL's server path computes beta 0 on this top-k support; stoke applies the same masked
formula for every beta).
"""

import json
import pathlib

import torch
import trl
from trl.experimental.gkd.gkd_trainer import GKDTrainer
from trl.experimental.server_distillation.server_distillation_trainer import (
    _add_tail_bucket,
    _jsd_divergence,
)

B, S, V = 2, 5, 13


def main():
    assert trl.__version__ == "1.16.0", trl.__version__
    assert torch.__version__.startswith("2.15.0"), torch.__version__
    g = torch.Generator().manual_seed(20261203)
    student = (torch.rand(B, S, V, generator=g, dtype=torch.float64) * 8 - 4)
    teacher = (torch.rand(B, S, V, generator=g, dtype=torch.float64) * 8 - 4)
    labels = torch.full((B, S), -100, dtype=torch.long)
    labels[0, 1:4] = torch.randint(0, V, (3,), generator=g)
    labels[1, 1:5] = torch.randint(0, V, (4,), generator=g)
    cases = []
    for beta in [0.0, 0.5, 1.0]:
        for temperature in [1.0, 2.0]:
            for masked in [True, False]:
                leaf = student.clone().requires_grad_(True)
                loss = GKDTrainer.generalized_jsd_loss(
                    student_logits=leaf,
                    teacher_logits=teacher,
                    labels=labels if masked else None,
                    beta=beta,
                    temperature=temperature,
                )
                loss.backward()
                cases.append(
                    {
                        "beta": beta,
                        "temperature": temperature,
                        "masked": masked,
                        "loss": loss.item(),
                        "grad": leaf.grad.tolist(),
                    }
                )
    out = {
        "generator": "scripts/make_distill_fixtures.py",
        "trl": trl.__version__,
        "torch": torch.__version__,
        "student": student.tolist(),
        "teacher": teacher.tolist(),
        "labels": labels.tolist(),
        "cases": cases,
    }
    path = pathlib.Path(__file__).resolve().parent.parent / "fixtures/distill/trl_gkd.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path} ({len(cases)} cases)")
    write_topk(student, teacher, labels)


def write_topk(student, teacher, labels):
    mask = labels != -100
    teacher_lp = torch.log_softmax(teacher, dim=-1)
    cases = []
    for k in [1, 3]:
        top_lp, top_ids = teacher_lp.topk(k, dim=-1)
        if k == 3:
            top_lp = top_lp.clone()
            top_lp[1, 2, 2] = float("-inf")  # a server that returned two entries here
        for beta in [0.0, 0.5, 1.0]:
            for temperature in [1.0, 2.0]:
                leaf = student.clone().requires_grad_(True)
                student_lp = torch.log_softmax(leaf / temperature, dim=-1)
                valid = top_lp > float("-inf")
                neg_inf = torch.full((), float("-inf"), dtype=student_lp.dtype)
                s_top = torch.where(valid, student_lp.gather(-1, top_ids), neg_inf)
                t_top = torch.where(valid, top_lp, neg_inf)
                s_sparse, support = _add_tail_bucket(s_top, valid)
                t_sparse, _ = _add_tail_bucket(t_top, valid)
                jsd = _jsd_divergence(s_sparse, t_sparse, beta, support)
                loss = jsd[mask].sum() / mask.sum()
                loss.backward()
                cases.append(
                    {
                        "k": k,
                        "beta": beta,
                        "temperature": temperature,
                        "teacher_ids": top_ids.tolist(),
                        "teacher_logprobs": [
                            [[None if v == float("-inf") else v for v in pos] for pos in row]
                            for row in top_lp.tolist()
                        ],
                        "loss": loss.item(),
                        "grad": leaf.grad.tolist(),
                    }
                )
    out = {
        "generator": "scripts/make_distill_fixtures.py",
        "trl": trl.__version__,
        "torch": torch.__version__,
        "student": student.tolist(),
        "labels": labels.tolist(),
        "cases": cases,
    }
    path = pathlib.Path(__file__).resolve().parent.parent / "fixtures/distill/trl_topk.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
