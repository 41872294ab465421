#!/usr/bin/env python3
"""Single requests, one after another, against an OpenAI-compatible server: the prefill time of
prompts of L random token ids (`max_tokens: 1`, the request's whole wall time, median of 3) and
the decode rate of 64 tokens for n = 1 and n = 64 samples of an 8-token prompt. Standard library
only. Prints one JSON object.

    python3 bench/serve_micro.py --url http://127.0.0.1:8000 --model NAME
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import urllib.request


def post(url, body):
    request = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.perf_counter()
    with urllib.request.urlopen(request) as response:
        json.load(response)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    rng = random.Random(1)

    def ids(n):
        return [rng.randrange(1000, 40000) for _ in range(n)]

    post(args.url, {"model": args.model, "prompt": ids(8), "max_tokens": 4})
    result = {}
    for length in [16, 64, 128, 256, 512]:
        times = [
            post(args.url, {"model": args.model, "prompt": ids(length), "max_tokens": 1})
            for _ in range(3)
        ]
        result[f"prefill_{length}_s"] = round(statistics.median(times), 3)
    for n in [1, 64]:
        elapsed = post(
            args.url,
            {
                "model": args.model,
                "prompt": ids(8),
                "max_tokens": 64,
                "n": n,
                "temperature": 1.0,
                "ignore_eos": True,
            },
        )
        result[f"decode_n{n}_tok_per_s"] = round(64 * n / elapsed, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
