#!/usr/bin/env python3
"""PyTorch reference for stoke's model benchmark.

What it is: the same tiny Llama as bench/bench_config.json (an HF LlamaConfig), run by
transformers' LlamaForCausalLM on CPU in float32 with eager attention and 2 threads, measuring
(a) training-step throughput: forward + next-token cross-entropy + backward, no optimizer,
    batch 8 x seq 256, 2 warmup steps then 5 timed steps;
(b) greedy decoding throughput with the KV cache: a 32-token prompt, then 128 new tokens, for
    batch 8 and batch 1 (prefill and decode timed separately).
It prints one JSON object. The Rust benchmark reports its own figures as ratios to these.

What it is not: part of CI (Python ML packages are never used by CI).

Usage:
    /work/venv/bin/python bench/torch_reference.py [--config bench/bench_config.json]
    /work/venv/bin/python bench/torch_reference.py --write-config   # regenerate the config file
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
    args = ap.parse_args()
    if args.write_config:
        bench_config().to_json_file(str(args.config))
        print(f"wrote {args.config}")
        return
    torch.set_num_threads(THREADS)
    torch.manual_seed(SEED)
    config = LlamaConfig.from_json_file(str(args.config))
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).to(torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    result = {
        "reference": "transformers LlamaForCausalLM, float32, eager attention, CPU",
        "config": str(args.config.relative_to(HERE.parent) if args.config.is_relative_to(HERE.parent) else args.config),
        "parameters": n_params,
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "train": bench_train(model, config.vocab_size),
        "decode": [bench_decode(model, config.vocab_size, b) for b in DECODE_BATCHES],
    }
    result["load_average_at_end"] = list(os.getloadavg())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
