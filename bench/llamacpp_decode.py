#!/usr/bin/env python3
"""llama.cpp decode reference (llama-cpp-python) for stoke's decode benchmark.

What it is: greedy decoding, batch 1, of the bf16 GGUF that bench/convert_smollm2.py writes
(SmolLM2-135M-Instruct, the same weights stoke reads from OUT/hf), with the protocol of
crates/rollout/examples/bench_model.rs: a 32-token prompt, then 128 new tokens; one untimed
warmup run; prefill and decode timed separately (decode tokens/s = 127 / decode time). 2
threads. Prints one JSON object.

What it is not: part of CI.

Usage:
    $VENV/bin/python bench/llamacpp_decode.py $SCRATCH/smollm2/smollm2-135m-bf16.gguf
Pinned: llama-cpp-python 0.3.36 (built from source by pip, with the machine's native flags).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import llama_cpp

PROMPT_LEN = 32
NEW_TOKENS = 128
THREADS = 2


def run(llm: llama_cpp.Llama, prompt: list[int]) -> tuple[float, float, list[int]]:
    llm.reset()
    start = time.perf_counter()
    first_at = None
    tokens: list[int] = []
    for token in llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
        if first_at is None:
            first_at = time.perf_counter()
        tokens.append(token)
        if len(tokens) == NEW_TOKENS:
            break
    end = time.perf_counter()
    return first_at - start, end - first_at, tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    args = ap.parse_args()
    llm = llama_cpp.Llama(model_path=args.gguf, n_threads=THREADS, n_threads_batch=THREADS, n_ctx=512, n_batch=512, verbose=False)
    # A fixed prompt of 32 real tokens.
    text = "The history of the printing press begins in the fifteenth century, when " * 4
    prompt = llm.tokenize(text.encode(), add_bos=False)[:PROMPT_LEN]
    run(llm, prompt)  # warmup
    prefill, decode, tokens = run(llm, prompt)
    print(json.dumps({
        "implementation": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
        "model": os.path.basename(args.gguf),
        "threads": THREADS,
        "batch": 1,
        "prompt_len": len(prompt),
        "new_tokens": len(tokens),
        "prefill_seconds": prefill,
        "decode_seconds": decode,
        "decode_tokens_per_second": (len(tokens) - 1) / decode,
        "system_info": llama_cpp.llama_print_system_info().decode(),
        "first_tokens": tokens[:8],
    }, indent=2))


if __name__ == "__main__":
    main()
