#!/usr/bin/env python3
"""Back-to-back training-step comparison: stoke vs the PyTorch reference (issue 5).

What it is: a driver that alternates runs of `torch_reference.py --only pretrain,sft_packed` and
stoke's `bench_train` example (optionally in several environment variants, e.g.
CANDLE_NUM_THREADS=1), records the load average next to every figure, prints one Markdown table
row per run, and appends every raw JSON result to a log (JSON lines).

What it is not: part of CI, or a statistics package: it reports what each run measured.

Usage:
    $VENV/bin/python bench/compare_train.py --pairs 3 \
        --stoke $STOKE_TARGET/release/examples/bench_train \
        [--variant default:] [--variant cnt1:CANDLE_NUM_THREADS=1] [--log $SCRATCH/compare.jsonl]

A variant is NAME:VAR=VALUE[,VAR=VALUE...] (empty after the colon = no extra variables).
RAYON_NUM_THREADS=2 is always set for stoke (the reference uses torch.set_num_threads(2)).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = ("pretrain", "sft_packed")


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition(":")
    env = {}
    for item in filter(None, assignments.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {text!r}: {item!r} is not VAR=VALUE")
        env[key] = value
    return name, env


def run_json(cmd: list[str], env: dict[str, str]) -> dict:
    out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def row(label: str, result: dict) -> str:
    cells = [label, time.strftime("%H:%M:%S", time.gmtime())]
    for workload in WORKLOADS:
        w = result[workload]
        cells.append(
            f"{w['tokens_per_second']:.0f} (cpu/wall {w['cpu_per_wall']:.2f}, "
            f"load {w['load_average_at_start'][0]:.2f})"
        )
        pieces = w.get("median_piece_ms", {})
        cells.append("/".join(f"{pieces.get(k, float('nan')):.0f}" for k in ("forward", "loss", "backward", "optimizer")))
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--stoke", type=Path, required=True, help="the bench_train binary")
    ap.add_argument("--variant", action="append", default=[], help="NAME:VAR=VALUE,... (repeatable)")
    ap.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "compare_train.jsonl")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    variants = [parse_variant(v) for v in (args.variant or ["default:"])]
    print("| run | UTC | pretrain tok/s | pretrain fwd/loss/bwd/opt ms | sft_packed tok/s | sft fwd/loss/bwd/opt ms |")
    print("|---|---|---|---|---|---|")
    with args.log.open("a") as log:
        for pair in range(args.pairs):
            torch = run_json([args.python, str(HERE / "torch_reference.py"), "--only", ",".join(WORKLOADS)], {})
            log.write(json.dumps({"pair": pair, "side": "pytorch", "result": torch}) + "\n")
            print(row(f"{pair} PyTorch", torch), flush=True)
            for name, env in variants:
                stoke = run_json([str(args.stoke)], {"RAYON_NUM_THREADS": "2", **env})
                log.write(json.dumps({"pair": pair, "side": f"stoke {name}", "env": env, "result": stoke}) + "\n")
                print(row(f"{pair} stoke {name}", stoke), flush=True)
                for workload in WORKLOADS:
                    same = all(torch[workload][k] == stoke[workload][k] for k in ("documents", "loss_tokens_per_step", "id_sum"))
                    if not same:
                        print(f"WARNING: {workload} batch layouts differ between the two sides", flush=True)


if __name__ == "__main__":
    main()
