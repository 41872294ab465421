#!/usr/bin/env python3
"""PyTorch reference for stoke's model benchmark.

What it is: the same tiny Llama as bench/bench_config.json (an HF LlamaConfig), run by
transformers' LlamaForCausalLM on CPU in float32 with eager attention and 2 threads, measuring
(a) training-step throughput: forward + next-token cross-entropy + backward, no optimizer,
    batch 8 x seq 256, 2 warmup steps then 5 timed steps;
(b) greedy decoding throughput with the KV cache: a 32-token prompt, then 128 new tokens, for
    batch 8 and batch 1 (prefill and decode timed separately);
(c) "pretrain": a full pretraining step, forward + next-token cross-entropy + backward + AdamW
    step (lr 1e-3, weight decay 0.1 on matrices and the output head, none on the embedding and
    norms; torch.optim.AdamW with its default foreach implementation), batch 8 x seq 256;
(d) "sft_packed": a full SFT step on packed documents: each row holds several documents of
    random lengths (16..128 tokens, the last one cut to fit), position ids restart at 0 in every
    document, a 4-D additive block-diagonal causal mask [B, 1, T, T] keeps documents apart, and
    the loss covers only the second half of each document (the "assistant" part); then
    backward and the same AdamW step.
(c) and (d) use the same batch, bit for bit, as stoke's `bench_train` example: token ids and
document lengths come from splitmix64 (seed below), implemented identically on both sides, and
both print the same layout checksums (documents, loss tokens).
tokens/s always counts every token of the batch (8 x 256 per step), loss-masked or not.
It prints one JSON object. The Rust benchmarks report their own figures as ratios to these.

What it is not: part of CI (Python ML packages are never used by CI).

Usage:
    $VENV/bin/python bench/torch_reference.py [--config bench/bench_config.json]
        [--only train,decode,pretrain,sft_packed] [--check-packing]
    $VENV/bin/python bench/torch_reference.py --write-config   # regenerate the config file
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

HERE = Path(__file__).resolve().parent
THREADS = 2
TRAIN_BATCH = 8
TRAIN_SEQ = 256
WARMUP_STEPS = 2
TIMED_STEPS = 5
PROMPT_LEN = 32
NEW_TOKENS = 128
DECODE_BATCHES = (8, 1)
SEED = 0
# --autocast bf16: forward and loss under torch.autocast("cpu", torch.bfloat16), PyTorch's
# default mixed precision on CPU (weights, gradients and AdamW state stay float32).
AUTOCAST: torch.dtype | None = None
# Training workloads (c) and (d); must match crates/optim/examples/bench_train.rs.
LR = 1e-3
WEIGHT_DECAY = 0.1
BATCH_SEED = 0x5EED_0005  # splitmix64 seed of the token ids and document layout
DOC_LEN_MIN = 16
DOC_LEN_MAX = 128  # inclusive
WORKLOADS = ("train", "decode", "pretrain", "sft_packed")


def bench_config() -> LlamaConfig:
    """The benchmark model. head_dim = 256 / 4 = 64; intermediate 688 ~ 8/3 * 256 rounded to 16."""
    return LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def train_step(model, ids: torch.Tensor) -> float:
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    return loss.item()


def bench_train(model, vocab: int) -> dict:
    gen = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, vocab, (TRAIN_BATCH, TRAIN_SEQ), generator=gen)
    model.train()
    for _ in range(WARMUP_STEPS):
        train_step(model, ids)
    times = []
    loss = 0.0
    cpu0 = time.process_time()
    for _ in range(TIMED_STEPS):
        t0 = time.perf_counter()
        loss = train_step(model, ids)
        times.append(time.perf_counter() - t0)
    cpu_s = time.process_time() - cpu0
    model.zero_grad(set_to_none=True)
    total = sum(times)
    tokens = TRAIN_BATCH * TRAIN_SEQ * TIMED_STEPS
    median = sorted(times)[len(times) // 2]
    return {
        "batch": TRAIN_BATCH,
        "seq": TRAIN_SEQ,
        "warmup_steps": WARMUP_STEPS,
        "timed_steps": TIMED_STEPS,
        "step_seconds": times,
        "tokens_per_second": tokens / total,
        "tokens_per_second_median_step": TRAIN_BATCH * TRAIN_SEQ / median,
        # process CPU seconds / wall seconds: ~THREADS when the machine was not contended.
        "cpu_per_wall": cpu_s / total,
        "last_loss": loss,
    }


class SplitMix64:
    """splitmix64 (Steele, Lea, Flood 2014): tiny, and trivially identical in Rust and Python."""

    MASK = (1 << 64) - 1

    def __init__(self, seed: int) -> None:
        self.state = seed & self.MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & self.MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
        return z ^ (z >> 31)


def training_batch(vocab: int, batch: int, seq: int) -> dict:
    """The shared batch of workloads (c) and (d). Per row, in order: document lengths
    DOC_LEN_MIN + next() % (DOC_LEN_MAX - DOC_LEN_MIN + 1), the last cut to fit the row; then the
    ids of all rows, row-major, next() % vocab. Document d of length L has prompt length L // 2;
    position t is a loss position iff t + 1 is in the same document and is not a prompt token."""
    rng = SplitMix64(BATCH_SEED)
    doc_ids, positions, loss_mask = [], [], []
    documents = 0
    for _ in range(batch):
        row_docs, row_pos, row_prompt = [], [], []
        doc = 0
        while len(row_docs) < seq:
            length = DOC_LEN_MIN + rng.next() % (DOC_LEN_MAX - DOC_LEN_MIN + 1)
            length = min(length, seq - len(row_docs))
            row_docs += [doc] * length
            row_pos += list(range(length))
            row_prompt += [length // 2] * length
            doc += 1
        documents += doc
        doc_ids.append(row_docs)
        positions.append(row_pos)
        loss_mask.append(
            [
                t + 1 < seq and row_docs[t + 1] == row_docs[t] and row_pos[t + 1] >= row_prompt[t + 1]
                for t in range(seq)
            ]
        )
    ids = [[rng.next() % vocab for _ in range(seq)] for _ in range(batch)]
    return {
        "ids": torch.tensor(ids, dtype=torch.long),
        "positions": torch.tensor(positions, dtype=torch.long),
        "doc_ids": torch.tensor(doc_ids, dtype=torch.long),
        "loss_mask": torch.tensor(loss_mask, dtype=torch.bool),
        "documents": documents,
        "id_sum": sum(map(sum, ids)),
    }


def document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """4-D additive float mask [B, 1, T, T]: 0 where query i may attend key j (same document,
    j <= i), the most negative float32 elsewhere (transformers' own convention for float masks)."""
    seq = doc_ids.shape[1]
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    allowed = (same & causal)[:, None]
    mask = torch.zeros(allowed.shape, dtype=torch.float32)
    return mask.masked_fill(~allowed, torch.finfo(torch.float32).min)


def adamw(model) -> torch.optim.AdamW:
    """AdamW with stoke's parameter groups: no weight decay on the embedding and the norms."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if "embed_tokens" in name or p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8)


def full_step(model, optimizer, ids, labels, attention_mask=None, position_ids=None) -> tuple[float, dict]:
    """Forward, cross-entropy (mean over labels != -100), backward, optimizer step. Returns the
    loss and the seconds of each piece (CPU execution is synchronous, so the splits are exact)."""
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=AUTOCAST or torch.float32, enabled=AUTOCAST is not None):
        logits = model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids).logits
        t1 = time.perf_counter()
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
    value = loss.item()
    t2 = time.perf_counter()
    loss.backward()
    t3 = time.perf_counter()
    optimizer.step()
    t4 = time.perf_counter()
    return value, {"forward": t1 - t0, "loss": t2 - t1, "backward": t3 - t2, "optimizer": t4 - t3}


def bench_full_step(config: LlamaConfig, workload: str) -> dict:
    """Workload (c) or (d) on a fresh model (seed SEED) and a fresh optimizer."""
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.train()
    optimizer = adamw(model)
    batch = training_batch(config.vocab_size, TRAIN_BATCH, TRAIN_SEQ)
    ids = batch["ids"]
    if workload == "pretrain":
        labels, attention_mask, position_ids = ids, None, None
        loss_tokens = TRAIN_BATCH * (TRAIN_SEQ - 1)
    else:
        # labels[:, t + 1] is the target of position t; -100 (ignored) off the loss mask.
        shifted = torch.zeros_like(batch["loss_mask"])
        shifted[:, 1:] = batch["loss_mask"][:, :-1]
        labels = ids.masked_fill(~shifted, -100)
        attention_mask = document_mask(batch["doc_ids"])
        position_ids = batch["positions"]
        loss_tokens = int(batch["loss_mask"].sum())
    losses = []
    for _ in range(WARMUP_STEPS):
        losses.append(full_step(model, optimizer, ids, labels, attention_mask, position_ids)[0])
    times, pieces = [], []
    load_start = list(os.getloadavg())
    cpu0 = time.process_time()
    for _ in range(TIMED_STEPS):
        t0 = time.perf_counter()
        loss, step_pieces = full_step(model, optimizer, ids, labels, attention_mask, position_ids)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
        pieces.append(step_pieces)
    cpu_s = time.process_time() - cpu0
    total = sum(times)
    median = sorted(times)[len(times) // 2]
    return {
        "workload": workload,
        "batch": TRAIN_BATCH,
        "seq": TRAIN_SEQ,
        "warmup_steps": WARMUP_STEPS,
        "timed_steps": TIMED_STEPS,
        "documents": batch["documents"] if workload == "sft_packed" else TRAIN_BATCH,
        "loss_tokens_per_step": loss_tokens,
        "id_sum": batch["id_sum"],
        "step_seconds": times,
        "tokens_per_second": TRAIN_BATCH * TRAIN_SEQ * TIMED_STEPS / total,
        "tokens_per_second_median_step": TRAIN_BATCH * TRAIN_SEQ / median,
        "median_piece_ms": {k: sorted(p[k] for p in pieces)[len(pieces) // 2] * 1e3 for k in pieces[0]},
        "cpu_per_wall": cpu_s / total,
        "load_average_at_start": load_start,
        "load_average_at_end": list(os.getloadavg()),
        "losses": losses,
    }


@torch.no_grad()
def check_packing(config: LlamaConfig) -> dict:
    """Faithfulness check of (d): the packed forward (4-D mask + position ids) gives the same
    logits as each document of row 0 run on its own."""
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    batch = training_batch(config.vocab_size, TRAIN_BATCH, TRAIN_SEQ)
    packed = model(
        input_ids=batch["ids"][:1],
        attention_mask=document_mask(batch["doc_ids"][:1]),
        position_ids=batch["positions"][:1],
    ).logits[0]
    worst = 0.0
    docs = batch["doc_ids"][0]
    for d in docs.unique().tolist():
        idx = (docs == d).nonzero().flatten()
        alone = model(input_ids=batch["ids"][:1, idx]).logits[0]
        worst = max(worst, (alone - packed[idx]).abs().max().item())
    return {"row0_documents": len(docs.unique()), "max_abs_logit_difference": worst}


@torch.inference_mode()
def bench_decode(model, vocab: int, batch: int) -> dict:
    model.eval()
    gen = torch.Generator().manual_seed(SEED + 2)
    prompt = torch.randint(0, vocab, (batch, PROMPT_LEN), generator=gen)

    def run() -> tuple[float, float, torch.Tensor]:
        cache = DynamicCache(config=model.config)
        t0 = time.perf_counter()
        out = model(input_ids=prompt, cache=cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        t1 = time.perf_counter()
        generated = [nxt]
        for _ in range(NEW_TOKENS - 1):
            out = model(input_ids=nxt, cache=cache, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            generated.append(nxt)
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, torch.cat(generated, dim=1)

    run()  # warmup
    cpu0 = time.process_time()
    prefill_s, decode_s, tokens = run()
    cpu_s = time.process_time() - cpu0
    return {
        "batch": batch,
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
        "prefill_seconds": prefill_s,
        # The first new token comes from the prefill; the remaining NEW_TOKENS - 1 from decode steps.
        "decode_seconds": decode_s,
        "decode_tokens_per_second": batch * (NEW_TOKENS - 1) / decode_s,
        "end_to_end_tokens_per_second": batch * NEW_TOKENS / (prefill_s + decode_s),
        "cpu_per_wall": cpu_s / (prefill_s + decode_s),
        "first_row_first_tokens": tokens[0, :8].tolist(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=HERE / "bench_config.json")
    ap.add_argument("--write-config", action="store_true", help="write bench_config() to --config and exit")
    ap.add_argument("--only", default=",".join(WORKLOADS), help=f"comma-separated subset of {','.join(WORKLOADS)}")
    ap.add_argument("--autocast", choices=["bf16"], help="training steps under torch.autocast(cpu, bfloat16)")
    ap.add_argument("--decode-dtype", choices=["f32", "bf16"], default="f32", help="model dtype for the decode workload")
    ap.add_argument("--attn", default="eager", help="transformers attention implementation (eager, sdpa)")
    ap.add_argument("--check-packing", action="store_true", help="also compare packed vs per-document logits")
    args = ap.parse_args()
    only = [w for w in args.only.split(",") if w]
    if unknown := [w for w in only if w not in WORKLOADS]:
        ap.error(f"--only: unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    if args.write_config:
        bench_config().to_json_file(str(args.config))
        print(f"wrote {args.config}")
        return
    torch.set_num_threads(THREADS)
    torch.manual_seed(SEED)
    config = LlamaConfig.from_json_file(str(args.config))
    config._attn_implementation = args.attn
    global AUTOCAST
    AUTOCAST = torch.bfloat16 if args.autocast == "bf16" else None
    model = LlamaForCausalLM(config).to(torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    result = {
        "reference": f"transformers LlamaForCausalLM, float32{' + autocast bf16' if AUTOCAST else ''}, {args.attn} attention, CPU",
        "config": str(args.config.relative_to(HERE.parent) if args.config.is_relative_to(HERE.parent) else args.config),
        "parameters": n_params,
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    if "train" in only:
        result["train"] = bench_train(model, config.vocab_size)
    if "decode" in only:
        decode_model = model.to(torch.bfloat16) if args.decode_dtype == "bf16" else model
        result["decode_dtype"] = args.decode_dtype
        result["decode"] = [bench_decode(decode_model, config.vocab_size, b) for b in DECODE_BATCHES]
    for workload in ("pretrain", "sft_packed"):
        if workload in only:
            result[workload] = bench_full_step(config, workload)
    if args.check_packing:
        result["check_packing"] = check_packing(config)
    result["load_average_at_end"] = list(os.getloadavg())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
